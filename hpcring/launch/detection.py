"""Which launcher started this process (`hpcring run`, srun, jsrun, mpirun, or none), from the variables each
one sets. Nothing here imports MPI or torch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hpcring.errors import ConfigError, choices

Launcher = Literal["hpcring", "srun", "jsrun", "mpirun", "none"]
LAUNCHERS: tuple[Launcher, ...] = ("hpcring", "srun", "jsrun", "mpirun", "none")


@dataclass(frozen=True)
class Detected:
    """What the environment says about this process: which launcher started it and the values it exposes.

    Fields a launcher does not publish are None (e.g. Open MPI has no node index: `hpcring.init()` derives
    cross_rank/cross_size from the communicator instead). `node` is the index of this rank's node when known.
    """

    launcher: Launcher
    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    node: int | None = None
    num_nodes: int | None = None

    @property
    def launched(self) -> bool:
        """True when some launcher started this process as one rank of a job."""
        return self.launcher != "none"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    """First of `names` present in env as an integer; a present but malformed value is an error, not None."""
    for name in names:
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            return int(value.strip())
        except ValueError:
            raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None
    return None


def _count_nodes(nodelist: str | None) -> int | None:
    """Number of hosts in LSB_MCPU_HOSTS-style 'host n host n' lists (jsrun); None when absent."""
    if not nodelist:
        return None
    words = nodelist.split()
    hosts = {words[i] for i in range(0, len(words) - 1, 2)}
    # LSF lists the launch (batch) node first with one slot; it runs no compute ranks under jsrun.
    return max(len(hosts) - 1, 1) if len(hosts) > 1 else len(hosts)


def detect(env: Mapping[str, str] | None = None) -> Detected:
    """Which launcher started us, from the variables each one sets (hpcring first: it runs under mpiexec).

    hpcring: HPCRING_RANK...; srun: SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID; jsrun:
    JSM_NAMESPACE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; Open MPI's mpirun: OMPI_COMM_WORLD_*; MPICH hydra and other
    PMI launchers: PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS. A Slurm *allocation* alone (SLURM_JOB_ID
    without SLURM_PROCID, e.g. mpirun inside sbatch) is not srun: the MPI variables win there.
    """
    e = os.environ if env is None else env
    if "HPCRING_RANK" in e:
        return Detected(
            "hpcring",
            rank=_int(e, "HPCRING_RANK"),
            size=_int(e, "HPCRING_SIZE"),
            local_rank=_int(e, "HPCRING_LOCAL_RANK"),
            local_size=_int(e, "HPCRING_LOCAL_SIZE"),
            node=_int(e, "HPCRING_CROSS_RANK"),
            num_nodes=_int(e, "HPCRING_CROSS_SIZE"),
        )
    mpi = mpi_rank_size(e)
    if "SLURM_PROCID" in e and (mpi is None or _agree(mpi, _slurm_rank_size(e))):
        # srun itself started us (with --mpi=pmi2/pmix the MPI variables agree with Slurm's). Under mpirun
        # inside an allocation the ranks inherit the Slurm variables of the daemon step, which disagree.
        return Detected(
            "srun",
            rank=_int(e, "SLURM_PROCID"),
            size=_int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
            local_rank=_int(e, "SLURM_LOCALID"),
            local_size=_local_size_slurm(e),
            node=_int(e, "SLURM_NODEID"),
            num_nodes=_int(e, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
        )
    if "JSM_NAMESPACE_RANK" in e:
        return Detected(
            "jsrun",
            rank=_int(e, "JSM_NAMESPACE_RANK"),
            size=_int(e, "JSM_NAMESPACE_SIZE"),
            local_rank=_int(e, "JSM_NAMESPACE_LOCAL_RANK"),
            local_size=_int(e, "JSM_NAMESPACE_LOCAL_SIZE"),
            num_nodes=_count_nodes(e.get("LSB_MCPU_HOSTS")),
        )
    if "OMPI_COMM_WORLD_RANK" in e:
        return Detected(
            "mpirun",
            rank=_int(e, "OMPI_COMM_WORLD_RANK"),
            size=_int(e, "OMPI_COMM_WORLD_SIZE"),
            local_rank=_int(e, "OMPI_COMM_WORLD_LOCAL_RANK"),
            local_size=_int(e, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        )
    if "PMI_RANK" in e or "PMIX_RANK" in e:
        return Detected(
            "mpirun",
            rank=_int(e, "PMI_RANK", "PMIX_RANK"),
            size=_int(e, "PMI_SIZE"),
            local_rank=_int(e, "MPI_LOCALRANKID"),
            local_size=_int(e, "MPI_LOCALNRANKS"),
        )
    return Detected("none")


def mpi_rank_size(e: Mapping[str, str]) -> tuple[int | None, int | None] | None:
    """(rank, size) as the MPI library's launcher published them, or None when no MPI launcher did."""
    if "OMPI_COMM_WORLD_RANK" in e:
        return _int(e, "OMPI_COMM_WORLD_RANK"), _int(e, "OMPI_COMM_WORLD_SIZE")
    if "PMI_RANK" in e or "PMIX_RANK" in e:
        return _int(e, "PMI_RANK", "PMIX_RANK"), _int(e, "PMI_SIZE")
    return None


def _slurm_rank_size(e: Mapping[str, str]) -> tuple[int | None, int | None]:
    return _int(e, "SLURM_PROCID"), _int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")


def _agree(mpi: tuple[int | None, int | None], slurm: tuple[int | None, int | None]) -> bool:
    """Same rank, and the same size where both publish one."""
    return mpi[0] == slurm[0] and (mpi[1] is None or slurm[1] is None or mpi[1] == slurm[1])


def _local_size_slurm(e: Mapping[str, str]) -> int | None:
    """Tasks on this node under srun: SLURM_TASKS_PER_NODE is like '2(x3),1', indexed by SLURM_NODEID."""
    node = _int(e, "SLURM_NODEID")
    spec = e.get("SLURM_STEP_TASKS_PER_NODE") or e.get("SLURM_TASKS_PER_NODE")
    if node is None or not spec:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        count, _, rep = part.partition("(x")
        try:
            counts += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
        except ValueError:
            raise ConfigError(f"SLURM tasks-per-node value {spec!r} is not like '2(x3),1'") from None
    return counts[node] if node < len(counts) else None


def check_launcher(name: str) -> Launcher:
    """Validate a launcher name given by a user (e.g. in a test or a profile)."""
    for launcher in LAUNCHERS:
        if launcher == name:
            return launcher
    raise ConfigError(f"unknown launcher {name!r}; allowed: {choices(LAUNCHERS)}")
