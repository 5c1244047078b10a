"""Form one MPI world from processes that no single `mpiexec` started (MPI dynamic processes).

Ray places its workers as actors; no launcher starts them as one MPI job. MPI's answer is the port API:
rank 0 opens a port (`MPI_Open_port`) and publishes its name out of band (a `rendezvous_store` served by
the Ray driver); every other process connects to it. Each connection gives an intercommunicator between
the world formed so far and the newcomer; merging it makes the next, larger intracommunicator. Newcomers
are let in one at a time, in rank order (rank 0 publishes whose turn it is): MPICH segfaults in
`MPI_Comm_accept` when two connect to one port at once.

What works is MPICH with each process its own one-process job (`mpiexec -n 1 python ...`: hydra gives every
job its own namespace). Plain singletons (all get the same world id, MPICH issue #7805) and Open MPI 5 (no
PMIx server to exchange through) fail; docs/dev/ray.md lists every variant tried. `check_support()` says so
before anything hangs.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from hpcring._deps import mpi
from hpcring.errors import ConfigError

# Variables a process manager sets for its processes (hydra: PMI_FD / PMI_PORT; PMIx servers: PMIX_RANK).
_PM_VARIABLES = ("PMI_FD", "PMI_PORT", "PMIX_RANK")


class Store(Protocol):
    """What `form_world` needs from the out-of-band channel (`rendezvous_store.StoreClient` is one)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str, timeout: float) -> str: ...


def check_support() -> None:
    """ConfigError unless this process can take part: MPICH, started as a one-process job of a launcher."""
    MPI = mpi()
    library = MPI.Get_library_version()
    if "MPICH" not in library:
        first = library.strip().splitlines()[0] if library.strip() else "unknown MPI"
        raise ConfigError(
            f"forming an MPI world without a common mpiexec needs MPICH; mpi4py loaded {first}. Install "
            "'hpcring[mpich]' in the workers' environment (Open MPI 5 singletons cannot connect: they "
            "have no PMIx server)"
        )
    if not any(name in os.environ for name in _PM_VARIABLES):
        raise ConfigError(
            "this process was not started by an MPI launcher: run each worker as `mpiexec -n 1 python ...` "
            "(MPICH 5.0 singletons cannot connect to each other, MPICH issue #7805)"
        )


def form_world(store: Store, rank: int, size: int, *, key: str = "world", timeout: float = 60.0) -> Any:
    """Collective over `size` processes, each calling with its own `rank`: returns their Intracomm.

    Newcomers join in rank order and merge above the others, so rank order needs no final reordering.
    `key` names this world in the store, so a world that re-forms (elastic) never reads an old port.
    Rank 0 must be alive for the others to connect; a process that never arrives blocks the others in
    `MPI_Comm_accept`, so the caller supervises with its own deadline (the Ray executor kills the workers).
    """
    if not 0 <= rank < size:
        raise ConfigError(f"rendezvous rank {rank} is outside 0..{size - 1} (world size {size})")
    MPI = mpi()
    if size == 1:
        return MPI.COMM_SELF.Dup()
    check_support()
    if rank == 0:
        port = MPI.Open_port()
        store.set(f"{key}/port", port)
        comm = MPI.COMM_SELF.Dup()
    else:
        store.get(f"{key}/turn/{rank}", timeout)
        port = store.get(f"{key}/port", timeout)
        comm = _merge(MPI.COMM_SELF.Connect(port, root=0), high=True)
    while comm.Get_size() < size:
        if comm.Get_rank() == 0:
            store.set(f"{key}/turn/{comm.Get_size()}", "go")
        merged = _merge(comm.Accept(port, root=0), high=False)
        comm.Free()
        comm = merged
    if rank == 0:
        MPI.Close_port(port)
    return comm


def _merge(inter: Any, *, high: bool) -> Any:
    """The intracommunicator of both sides of `inter` (newcomers high), and `inter` disconnected."""
    merged = inter.Merge(high=high)
    inter.Disconnect()
    return merged
