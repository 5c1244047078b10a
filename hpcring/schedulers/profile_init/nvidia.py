"""`nvidia-smi topo -m`: each GPU's CPU and NUMA affinity, and which NICs share its PCIe path.

The matrix is a header row of device labels (GPU0.., NIC0.. or RDMA device names such as mlx5_0) followed by
"CPU Affinity", "NUMA Affinity" (and, in newer drivers, "GPU NUMA ID"); each GPU row holds one link code per
device, then its CPU list and NUMA node. A "NIC Legend" maps NICk to device names. PIX, PXB (the same PCIe
switch tree) and PHB (the same host bridge) count as attached.
"""

from __future__ import annotations

import re

from hpcring.schedulers import cpuset
from hpcring.schedulers.profile_init.facts import GpuFact, NicFact

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
ATTACHED = ("PIX", "PXB", "PHB")


def parse(text: str) -> tuple[list[GpuFact], list[NicFact]]:
    """GPUs with their NUMA node and CPUs, and NICs with the GPUs attached to them."""
    lines = _ANSI.sub("", text).splitlines()
    header = next((ln.split() for ln in lines if ln.split()[:1] == ["GPU0"]), None)
    if header is None:
        return [], []
    devices = header[: header.index("CPU")] if "CPU" in header else header
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.MULTILINE))
    gpus: list[GpuFact] = []
    links: dict[str, list[int]] = {d: [] for d in devices if not d.startswith("GPU")}
    for line in lines:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]) or tokens == header:
            continue
        index = int(tokens[0][3:])
        cells, tail = tokens[1 : 1 + len(devices)], tokens[1 + len(devices) :]
        for dev, code in zip(devices, cells, strict=False):
            if dev in links and code in ATTACHED:
                links[dev].append(index)
        cpus = _cpus(tail[0]) if tail else ()
        numa = int(tail[1]) if len(tail) > 1 and tail[1].isdigit() else None
        gpus.append(GpuFact(index, numa, cpus))
    nics = [NicFact(legend.get(dev, dev), None, tuple(idx)) for dev, idx in links.items()]
    return gpus, nics


def _cpus(text: str) -> tuple[int, ...]:
    try:
        return cpuset.parse(text)
    except ValueError:
        return ()
