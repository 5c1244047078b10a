"""Flux: `flux resource list`, a table `STATE NNODES NCORES NGPUS NODELIST` with rows free, allocated and
down. Summed over the states it gives the instance's nodes, cores and GPUs (a per-node check of /sys)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FluxResources:
    nodes: int
    cores: int
    gpus: int


def resources(text: str) -> FluxResources | None:
    """Totals over every state row; None when the text is not that table."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0][:4] != ["STATE", "NNODES", "NCORES", "NGPUS"]:
        return None
    total = [0, 0, 0]
    for row in lines[1:]:
        if len(row) >= 4 and all(x.isdigit() for x in row[1:4]):
            for i in range(3):
                total[i] += int(row[1 + i])
    return FluxResources(*total)
