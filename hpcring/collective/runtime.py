"""Process-wide state: the global Topology created by `init()`, and the getters that read it.

`init()` is idempotent and collective over the ranks it covers. It also fills in the rank environment
(HPCRING_RANK..., torchrun's RANK/WORLD_SIZE/MASTER_ADDR...) when the job was started by srun, jsrun or a bare
mpirun instead of `hpcring run`, so user code and torch.distributed see the same variables either way
(setdefault: what a launcher already set wins).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from hpcring._deps import mpi
from hpcring.collective.algorithms.workspace import release
from hpcring.collective.mpi_init import ensure_initialized
from hpcring.collective.topology import Topology
from hpcring.contracts.rank_env import rank_environment
from hpcring.errors import ConfigError, NotInitializedError

_lock = threading.RLock()
_global: Topology | None = None
_INIT_TAG = 0x4849
DEFAULT_MASTER_PORT = 29500


def _from_ranks(ranks: Sequence[int]) -> Topology:
    """Topology over a list of COMM_WORLD ranks; only those ranks may call init (MPI_Comm_create_group)."""
    world = mpi().COMM_WORLD
    chosen = sorted(int(r) for r in ranks)
    size = world.Get_size()
    if not chosen or len(set(chosen)) != len(chosen) or not all(0 <= r < size for r in chosen):
        raise ConfigError(
            f"init(comm=...) ranks must be distinct world ranks from 0 to {size - 1}, got {list(ranks)}"
        )
    if world.Get_rank() not in chosen:
        raise ConfigError(
            f"world rank {world.Get_rank()} is not in init(comm={chosen}); only those ranks may call it"
        )
    group = world.Get_group()
    sub_group = group.Incl(chosen)
    sub = world.Create_group(sub_group, _INIT_TAG)
    sub_group.Free()
    group.Free()
    try:
        return Topology.create(sub)
    finally:
        sub.Free()


def _export_rank_environment(topo: Topology) -> None:
    """setdefault the rank environment (`contracts.rank_env`) so srun/jsrun/mpirun jobs match."""
    master = topo.comm.bcast(os.environ.get("MASTER_ADDR") or socket.gethostname(), root=0)
    values = rank_environment(
        rank=topo.rank,
        size=topo.size,
        local_rank=topo.local_rank,
        local_size=topo.local_size,
        cross_rank=topo.cross_rank,
        cross_size=topo.cross_size,
        hostname=socket.gethostname(),
        master_addr=master,
        master_port=int(os.environ.get("MASTER_PORT") or DEFAULT_MASTER_PORT),
    )
    for key, value in values.items():
        os.environ.setdefault(key, str(value))


def init(comm: Any = None) -> Topology:
    """Initialise hpcring over COMM_WORLD (None), an mpi4py Intracomm, or a list of world ranks.

    Idempotent: a second call returns the existing topology. The communicator is duplicated, so hpcring's
    traffic never mixes with the caller's own messages on it. MPI not yet initialised (mpi4py.rc.initialize =
    False) is started here and finalised at exit; one started at too low a thread level is an error
    (`mpi_init`).
    """
    global _global
    with _lock:
        if _global is not None:
            return _global
        MPI = mpi()
        ensure_initialized(MPI, before_finalize=shutdown)
        if comm is None:
            topo = Topology.create(MPI.COMM_WORLD)
        elif isinstance(comm, MPI.Intracomm):
            topo = Topology.create(comm)
        elif isinstance(comm, Sequence) and not isinstance(comm, str):
            topo = _from_ranks(comm)
        else:
            raise ConfigError(
                "init(comm=...) takes None, an mpi4py Intracomm or a list of world ranks, "
                f"got {type(comm).__name__}"
            )
        _export_rank_environment(topo)
        _global = topo
        return topo


def shutdown() -> None:
    """Free hpcring's communicators (MPI itself stays up until exit: mpi4py, or hpcring when it started MPI,
    finalises it then)."""
    global _global
    with _lock:
        if _global is not None:
            _global.free()
            _global = None
        release()


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _global is not None


def topology() -> Topology:
    """The global topology; NotInitializedError before init()."""
    topo = _global
    if topo is None:
        raise NotInitializedError("hpcring is not initialized: call hpcring.init() first")
    return topo


def rank() -> int:
    """This process's rank in the hpcring world."""
    return topology().rank


def size() -> int:
    """Number of ranks in the hpcring world."""
    return topology().size


def local_rank() -> int:
    """Rank among the processes on this node."""
    return topology().local_rank


def local_size() -> int:
    """Number of ranks on this node."""
    return topology().local_size


def cross_rank() -> int:
    """Rank among the processes with this local rank across nodes (the node index on equal nodes)."""
    return topology().cross_rank


def cross_size() -> int:
    """Number of nodes holding a rank with this local rank."""
    return topology().cross_size


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return topology().is_homogeneous
