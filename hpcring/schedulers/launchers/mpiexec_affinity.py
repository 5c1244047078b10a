"""The per-rank GPU wrapper that `mpiexec` ranks start through (PBS sites: Polaris, Aurora).

PALS and hydra bind CPUs but leave GPUs to the job, so ALCF's examples start each rank through a small script
that picks the rank's GPU from its node-local rank id. This one is generated from the RankMap (not a fixed
table): local rank i sees exactly the GPUs (or Intel GPU tiles, `gpu.tile`) the mapping gave it, through the
vendor's visibility variable. It reads the local rank from PALS (PALS_LOCAL_RANKID), MPICH hydra
(PMI_LOCAL_RANK) or Intel MPI (MPI_LOCALRANKID), and refuses to start a rank it cannot place.
"""

from __future__ import annotations

from hpcring.errors import ConfigError
from hpcring.schedulers.mapping import RankMap, Slot
from hpcring.schedulers.shell import quote

# The variable each vendor's runtime reads to restrict the devices a process sees.
VISIBLE_DEVICES = {
    "nvidia": "CUDA_VISIBLE_DEVICES",
    "amd": "ROCR_VISIBLE_DEVICES",
    "intel": "ZE_AFFINITY_MASK",
}
LOCAL_RANK_VARS = ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID")


def needed(rm: RankMap) -> bool:
    """A wrapper is needed when ranks use GPUs and must each see only their own."""
    return rm.shape.gpus_per_rank > 0 and rm.profile.node.gpu_visibility == "isolated"


def devices(slot: Slot) -> str:
    """What the visibility variable holds for this slot: "0", "0,1", or tiles "0.0,0.1" where the mapping
    gives tiles."""
    if slot.tiles:
        return ",".join(f"{gpu}.{tile}" for gpu, tile in slot.tiles)
    return ",".join(str(g) for g in slot.gpus)


def per_local_rank(rm: RankMap) -> list[str]:
    """Devices of each local rank; every node layout must agree (the wrapper cannot tell nodes apart)."""
    table: dict[int, str] = {}
    for layout in rm.layouts:
        for slot in layout:
            dev = devices(slot)
            if table.setdefault(slot.local_rank, dev) != dev:
                raise ConfigError(
                    f"local rank {slot.local_rank} gets GPUs {table[slot.local_rank]} on some nodes and "
                    f"{dev} on others; the mpiexec GPU wrapper needs the same per-node layout: use ranks "
                    "that divide evenly over the nodes"
                )
    return [table[i] for i in sorted(table)]


def script(rm: RankMap, local_rank_vars: tuple[str, ...] = LOCAL_RANK_VARS) -> str:
    """The wrapper's text: `bash WRAPPER command...` sets the rank's devices and execs the command.

    `local_rank_vars`: where the local rank is read from, first set wins (Kubernetes' mpirun adds Open MPI's).
    """
    vendor = rm.profile.node.gpu_vendor
    if vendor not in VISIBLE_DEVICES:
        raise ConfigError(
            f"no GPU visibility variable known for gpu_vendor {vendor!r}; known: {', '.join(VISIBLE_DEVICES)}"
        )
    var = VISIBLE_DEVICES[vendor]
    lookup = "${" + ":-${".join(local_rank_vars) + ":-" + "}" * len(local_rank_vars)
    lines = [
        "#!/bin/bash",
        f"# hpcring GPU selection for mpiexec ranks, profile {' '.join(rm.profile.name.splitlines())}: "
        "generated from the rank mapping.",
        f"# Local rank i sees only its own devices through {var}; the command follows as arguments.",
        "set -euo pipefail",
        f'local_rank="{lookup}"',
        'case "$local_rank" in',
    ]
    for i, dev in enumerate(per_local_rank(rm)):
        lines.append(f"  {i}) devices={quote(dev)} ;;")
    missing = quote(
        "hpcring: no GPU for this rank: the local rank (" + ", ".join(local_rank_vars) + ") is unset or "
        "beyond the mapping's ranks per node:"
    )
    lines += [
        "  *)",
        f"    echo {missing} \"'$local_rank'\" >&2",
        "    exit 2",
        "    ;;",
        "esac",
        f'export {var}="$devices"',
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"
