"""Slurm: `scontrol show config` (`Key = Value` lines), `scontrol show partition` (records of `Key=Value`
tokens, one record per partition, separated by blank lines) and `sinfo --noheader --format=%P|%l|%D` (one line
per partition, the default one marked `*`)."""

from __future__ import annotations

import re

from hpcring.schedulers import walltime
from hpcring.schedulers.profile_init.facts import QueueFact

SLURM_MPI = ("none", "pmi2", "pmix", "cray_shasta")  # what profile site.slurm.mpi accepts
SINFO_FORMAT = "%P|%l|%D"


def config(text: str) -> dict[str, str]:
    """`scontrol show config` as a dict (keys as Slurm spells them)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def mpi_default(conf: dict[str, str]) -> str | None:
    """MpiDefault when it is one hpcring can pass to srun --mpi (pmix_v4 counts as pmix)."""
    value = conf.get("MpiDefault", "").split("_")[0]
    return value if value in SLURM_MPI else None


def _seconds(text: str | None) -> int | None:
    """A Slurm time limit; UNLIMITED, infinite and NONE are no limit."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    try:
        return walltime.parse(text)
    except ValueError:
        return None


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def partitions(text: str) -> list[QueueFact]:
    """`scontrol show partition`: name, MaxTime, MaxNodes, Default=YES; hidden or down ones too."""
    out = []
    for record in re.split(r"\n\s*\n", text.strip()):
        fields = dict(re.findall(r"(\w+)=(\S*)", record))
        if "PartitionName" not in fields:
            continue
        out.append(
            QueueFact(
                fields["PartitionName"],
                _seconds(fields.get("MaxTime")),
                _count(fields.get("MaxNodes")),
                fields.get("Default") == "YES",
            )
        )
    return out


def sinfo(text: str) -> list[QueueFact]:
    """`sinfo --noheader --format=%P|%l|%D`: partition (default marked *), time limit, node count. The node
    count is the partition's size, not a per-job limit, so it is not used as max_nodes."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        name = parts[0].rstrip("*")
        out.append(QueueFact(name, _seconds(parts[1]), None, parts[0].endswith("*")))
    return out
