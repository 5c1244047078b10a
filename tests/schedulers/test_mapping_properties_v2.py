"""Property tests of the mapping over the node shapes schema v2 can describe: GPU tiles (Intel Max), APUs
(MI300A: GPU and cores in one package and memory), and many NICs, several per socket or attached to GPUs.

Besides the v1 invariants (`check_invariants`: no CPU or GPU given twice, reserved cores unused, contiguous
ranks, NUMA locality when there is room), every rank's tiles are its GPUs' (device, tile) pairs and no tile is
given twice; an APU rank's memory domains are its GPUs' domains; a rank owning GPUs that have NICs attached
gets exactly those NICs, so no such NIC is given to two ranks; every NIC named is one of the node's.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import yaml
from hypothesis import HealthCheck, given, settings
from test_mapping_properties import check_invariants

from hpcring.errors import JobShapeError
from hpcring.schedulers import cpuset, mapping, profile
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.model import Profile


@st.composite
def v2_profiles(draw: st.DrawFn) -> Profile:
    sockets = draw(st.integers(1, 4))
    cps = draw(st.integers(2, 12))
    domains = [list(range(s * cps, (s + 1) * cps)) for s in range(sockets)]
    reserved = {d[0] for d in domains} if draw(st.booleans()) else set()
    kind = draw(st.sampled_from(["tiles", "apu", "plain"]))
    gpus: list[dict[str, Any]] = []
    if kind == "tiles":  # whole GPUs of `tiles` tiles each, placed on a socket
        tiles = draw(st.integers(1, 4))
        for device in range(draw(st.integers(1, 3))):
            dom = draw(st.integers(0, sockets - 1))
            for tile in range(tiles):
                gpus.append({"index": len(gpus), "device": device, "tile": tile, "numa": dom})
    elif kind == "apu":  # one APU per socket, its GPU sharing the socket's cores and memory
        gpus = [{"index": s, "numa": s, "apu": True} for s in range(sockets)]
    else:
        for index in range(draw(st.integers(0, 6))):
            gpus.append({"index": index, "numa": draw(st.integers(0, sockets - 1))})
    nics = []
    for i in range(draw(st.integers(0, 10))):  # many NICs: several per socket and per GPU
        nic: dict[str, Any] = {
            "name": f"hsn{i}",
            "numa": draw(st.one_of(st.none(), st.integers(0, sockets - 1))),
        }
        if gpus and draw(st.booleans()):
            nic["gpus"] = sorted(draw(st.sets(st.integers(0, len(gpus) - 1), min_size=1, max_size=2)))
        nics.append(nic)
    data = {
        "schema_version": 2,
        "name": "generated-v2",
        "node": {
            "sockets": sockets,
            "cores_per_socket": cps,
            "threads_per_core": draw(st.integers(1, 2)),
            "reserved_cores": sorted(reserved),
            "numa": [{"id": i, "cores": cpuset.format_list(d)} for i, d in enumerate(domains)],
            "gpu_vendor": "intel" if kind == "tiles" else "amd",
            "gpus": gpus,
            "nics": nics,
        },
        "site": {"scheduler": draw(st.sampled_from(["slurm", "pbs", "flux"])), "launcher": "srun"},
    }
    data["site"]["launcher"] = {"slurm": "srun", "pbs": "mpiexec", "flux": "flux"}[data["site"]["scheduler"]]
    return profile.parse(yaml.safe_dump(data), "generated-v2")


def check_v2_invariants(prof: Profile, rm: mapping.RankMap) -> None:
    node = prof.node
    by_index = {g.index: g for g in node.gpus}
    names = {n.name for n in node.nics}
    for layout in rm.layouts:
        tiles = [t for s in layout for t in s.tiles]
        assert len(tiles) == len(set(tiles)), "a GPU tile was given to two ranks"
        for s in layout:
            gpus = [by_index[g] for g in s.gpus]
            assert list(s.tiles) == [(g.device, g.tile) for g in gpus if g.tile is not None]
            assert s.apu == any(g.apu for g in gpus)
            if gpus:
                assert set(s.mem_numa) == {g.numa for g in gpus}
            else:
                assert set(s.mem_numa) == {node.numa_of_core(c) for c in s.cores}
            assert set(s.nics) <= names and (s.nic == (s.nics[0] if s.nics else None))
            attached = [n.name for n in node.nics if set(n.gpus) & set(s.gpus)]
            if attached:
                assert list(s.nics) == attached, "a rank did not get the NICs attached to its GPUs"
            else:
                assert len(s.nics) == (1 if node.nics else 0)
        owner: dict[str, int] = {}
        for s in layout:
            for nic in node.nics:
                if len(nic.gpus) == 1 and nic.gpus[0] in s.gpus:
                    assert owner.setdefault(nic.name, s.local_rank) == s.local_rank, "NIC of one GPU shared"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=v2_profiles(), data=st.data())
def test_v2_mapping_invariants(prof: Profile, data: st.DataObject) -> None:
    node = prof.node
    usable = len(node.usable_cores)
    gpr = data.draw(st.integers(0, 2)) if node.gpus else 0
    rpn = data.draw(st.one_of(st.none(), st.integers(1, max(1, usable))))
    cpr = data.draw(st.one_of(st.none(), st.integers(1, usable)))
    job = JobSpec(
        nodes=data.draw(st.integers(1, 3)), ranks_per_node=rpn, gpus_per_rank=gpr, cpus_per_rank=cpr
    )
    try:
        rm = mapping.build(prof, job)
    except JobShapeError:
        return  # which shapes are feasible is test_mapping_properties' concern; here: what is placed
    check_invariants(prof, rm)
    check_v2_invariants(prof, rm)


@settings(max_examples=100, deadline=None)
@given(prof=v2_profiles())
def test_v2_default_shape(prof: Profile) -> None:
    """The default shape (one rank per GPU unit: per tile on tiled GPUs, per APU) maps whenever it fits."""
    if len(prof.node.gpus) > len(prof.node.usable_cores):
        return
    rm = mapping.build(prof, JobSpec(nodes=2))
    check_invariants(prof, rm)
    check_v2_invariants(prof, rm)
    if prof.node.gpus:
        assert rm.shape.max_ranks_per_node == len(prof.node.gpus)
