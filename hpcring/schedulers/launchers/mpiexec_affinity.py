"""The per-rank GPU wrapper that ranks start through: `mpiexec` ranks on PBS sites (Polaris, Aurora) and
`srun` ranks where the site documents a select_gpu wrapper instead of Slurm's per-task GPU binding (LUMI-G).

PALS and hydra bind CPUs but leave GPUs to the job, so ALCF's examples start each rank through a small script
that picks the rank's GPU from its node-local rank id; LUMI's `select_gpu` does the same under srun so that
every GCD stays in each task's cgroup (GPU-to-GPU IPC inside a node needs that). This one is generated from
the RankMap (not a fixed table): local rank i sees exactly the GPUs (or Intel GPU tiles) the mapping gave it,
through the vendor's visibility variable. It reads the local rank from the launcher's variables and refuses
to start a rank it cannot place.

Intel GPUs: the wrapper sets `ZE_FLAT_DEVICE_HIERARCHY=FLAT` (each tile one device, what ALCF's `frameworks`
module sets for PyTorch) with `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1` (device numbers in PCI order, as ALCF's
gpu_tile_compact.sh sets), so the mask holds FLAT device numbers (a tile's `index`), not COMPOSITE `gpu.tile`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcring.errors import ConfigError
from hpcring.schedulers.mapping import RankMap, Slot
from hpcring.schedulers.shell import quote

# The variable each vendor's runtime reads to restrict the devices a process sees.
VISIBLE_DEVICES = {
    "nvidia": "CUDA_VISIBLE_DEVICES",
    "amd": "ROCR_VISIBLE_DEVICES",
    "intel": "ZE_AFFINITY_MASK",
}
# Set before the mask, per vendor: the mask's numbering depends on them.
VENDOR_ENV: dict[str, tuple[tuple[str, str], ...]] = {
    "intel": (("ZE_FLAT_DEVICE_HIERARCHY", "FLAT"), ("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1")),
}
# Node-local rank variables: PALS, MPICH hydra and Intel MPI under mpiexec; Slurm's under srun.
LOCAL_RANK_VARS = ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "MPI_LOCALRANKID")
SLURM_LOCAL_RANK_VARS = ("SLURM_LOCALID",)
SUFFIX = "affinity"  # the wrapper file's suffix (and of its variable, HPCRING_AFFINITY)


def needed(rm: RankMap) -> bool:
    """A wrapper is needed when ranks use GPUs and must each see only their own."""
    return rm.shape.gpus_per_rank > 0 and rm.profile.node.gpu_visibility == "isolated"


def devices(slot: Slot) -> str:
    """What the visibility variable holds for this slot: "0", "0,1" (device numbers; on Intel GPUs the FLAT
    numbers of the rank's tiles, since the wrapper sets FLAT mode)."""
    return ",".join(str(g) for g in slot.gpus)


def per_local_rank(rm: RankMap, launcher: str = "mpiexec") -> list[str]:
    """Devices of each local rank; every node layout must agree (the wrapper cannot tell nodes apart)."""
    table: dict[int, str] = {}
    for layout in rm.layouts:
        for slot in layout:
            dev = devices(slot)
            if table.setdefault(slot.local_rank, dev) != dev:
                raise ConfigError(
                    f"local rank {slot.local_rank} gets GPUs {table[slot.local_rank]} on some nodes and "
                    f"{dev} on others; the {launcher} GPU wrapper needs the same per-node layout: use ranks "
                    "that divide evenly over the nodes"
                )
    return [table[i] for i in sorted(table)]


def script(rm: RankMap, local_rank_vars: Sequence[str] = LOCAL_RANK_VARS, launcher: str = "mpiexec") -> str:
    """The wrapper's text: `bash WRAPPER command...` sets the rank's devices and execs the command."""
    vendor = rm.profile.node.gpu_vendor
    if vendor not in VISIBLE_DEVICES:
        raise ConfigError(
            f"no GPU visibility variable known for gpu_vendor {vendor!r}; known: {', '.join(VISIBLE_DEVICES)}"
        )
    var = VISIBLE_DEVICES[vendor]
    lookup = "${" + ":-${".join(local_rank_vars) + ":-" + "}" * len(local_rank_vars)
    lines = [
        "#!/bin/bash",
        f"# hpcring GPU selection for {launcher} ranks, profile {' '.join(rm.profile.name.splitlines())}: "
        "generated from the rank mapping.",
        f"# Local rank i sees only its own devices through {var}; the command follows as arguments.",
        "set -euo pipefail",
        f'local_rank="{lookup}"',
        'case "$local_rank" in',
    ]
    for i, dev in enumerate(per_local_rank(rm, launcher)):
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
    ]
    lines += [f"export {k}={quote(v)}" for k, v in VENDOR_ENV.get(vendor, ())]
    lines += [f'export {var}="$devices"', 'exec "$@"']
    return "\n".join(lines) + "\n"
