"""`rocm-smi --showtoponuma`: the NUMA node of each AMD GPU (GCD), in lines such as
`GPU[4]          : (Topology) Numa Node: 0` (as LUMI's documentation shows it)."""

from __future__ import annotations

import re

from hpcring.schedulers.profile_init.facts import GpuFact

_LINE = re.compile(r"^GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)", re.MULTILINE)


def parse(text: str) -> list[GpuFact]:
    """GPUs in index order; a NUMA node of -1 (no affinity) is unknown."""
    found = {int(i): int(n) for i, n in _LINE.findall(text)}
    return [GpuFact(i, n if n >= 0 else None) for i, n in sorted(found.items())]
