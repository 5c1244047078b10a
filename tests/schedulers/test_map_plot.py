"""`hpcring map --plot`: the picture of a node shows each rank's cores, GPUs and NICs as the mapping has them.

The layout is read back from the SVG itself (each core and device carries an id), not from the drawing code.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sched_helpers import cli

from hpcring.schedulers import mapping, node_diagram, profile
from hpcring.schedulers.job import JobSpec

pytest.importorskip("matplotlib")

# (profile, nodes): Frontier and LUMI-G with 8 ranks a node, Polaris with 4, as the sites' diagrams show them.
SITES = [("frontier", 2), ("lumi-g", 2), ("polaris", 2)]
_CORE_ID = re.compile(r"core-(\d+)-(?:rank-(\d+)|idle|reserved)$")
_DEV_ID = re.compile(r"(gpu|nic)-(.+)-ranks-([\d_]+|none)$")


def _rankmap(name: str, nodes: int) -> mapping.RankMap:
    return mapping.build(profile.load(name), JobSpec(nodes=nodes))


def _svg_layout(path: Path) -> tuple[dict[int, list[int]], dict[str, tuple[int, ...]], str]:
    """rank -> cores, device label -> ranks, and every text of the picture, read from the SVG's ids."""
    root = ET.parse(path).getroot()
    cores: dict[int, list[int]] = {}
    devices: dict[str, tuple[int, ...]] = {}
    for el in root.iter():
        ident = el.get("id", "")
        m = _CORE_ID.match(ident)
        if m and m.group(2) is not None:
            cores.setdefault(int(m.group(2)), []).append(int(m.group(1)))
        d = _DEV_ID.match(ident)
        if d:
            devices[f"{d.group(1)}:{d.group(2)}"] = (
                () if d.group(3) == "none" else tuple(map(int, d.group(3).split("_")))
            )
    text = " ".join(t for el in root.iter() if el.tag.endswith("text") for t in el.itertext())
    return {r: sorted(c) for r, c in cores.items()}, devices, text


@pytest.mark.parametrize(("name", "nodes"), SITES)
def test_svg_shows_each_ranks_cores_gpus_and_nics(tmp_path: Path, name: str, nodes: int) -> None:
    rm = _rankmap(name, nodes)
    out = tmp_path / f"{name}.svg"
    res = cli("map", "--profile", name, "--nodes", str(nodes), "--plot", str(out))
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}" in res.stderr
    cores, devices, text = _svg_layout(out)
    slots = rm.slots(0)
    assert sorted(cores) == list(range(len(slots)))  # one colour group per rank of the node, no more
    for local, slot in enumerate(slots):
        assert cores[local] == sorted(slot.cores), f"rank {local}"
        for gpu in slot.gpus:
            assert local in devices[f"gpu:GPU{gpu}"]
        for nic in slot.nics or (slot.nic,):
            if nic is not None:
                assert local in devices[f"nic:{nic}"]
    assert f"{name}: node 0 of {nodes}" in text
    assert f"{len(slots)} per node" in text


def test_plot_node_numbers_ranks_globally(tmp_path: Path) -> None:
    out = tmp_path / "n1.svg"
    res = cli("map", "--profile", "frontier", "--nodes", "2", "--plot", str(out), "--plot-node", "1")
    assert res.returncode == 0, res.stderr
    cores, _, text = _svg_layout(out)
    assert sorted(cores) == list(range(8, 16))
    assert "node 1 of 2" in text


def test_png_is_written(tmp_path: Path) -> None:
    out = tmp_path / "polaris.png"
    res = cli("map", "--profile", "polaris", "--nodes", "1", "--plot", str(out))
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plot", "x.gif"], ".svg, .png, .pdf"),
        (["--plot", "x.svg", "--plot-node", "2"], "nodes 0-1"),
    ],
)
def test_bad_plot_values_say_what_is_allowed(tmp_path: Path, argv: list[str], message: str) -> None:
    res = cli("map", "--profile", "frontier", "--nodes", "2", *argv, cwd=tmp_path)
    assert res.returncode != 0
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_diagram_places_devices_in_their_numa_domain() -> None:
    rm = _rankmap("frontier", 1)
    d = node_diagram.build(rm)
    node = rm.profile.node
    for dom in d.domains:
        for dev in dom.devices:
            if dev.kind == "gpu":
                gpu = next(g for g in node.gpus if f"GPU {g.index}" == dev.label)
                assert gpu.numa == dom.numa
    reserved = {c.core for dom in d.domains for c in dom.cores if c.reserved}
    assert reserved == set(node.reserved_cores)
    assert sum(len(dom.cores) for dom in d.domains) == node.cores
