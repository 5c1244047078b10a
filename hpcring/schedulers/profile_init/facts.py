"""What the parsers find, in a form independent of where it came from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuFacts:
    """Sockets, cores, hardware threads and NUMA domains (physical core numbers)."""

    sockets: int
    cores_per_socket: int
    threads_per_core: int
    thread_numbering: str  # "scatter" or "compact"
    numa: tuple[tuple[int, tuple[int, ...]], ...]  # (id, physical cores); () when unknown


@dataclass(frozen=True)
class GpuFact:
    """A GPU as its vendor tool numbers it, and its NUMA domain when known."""

    index: int
    numa: int | None
    cpus: tuple[int, ...] = ()  # hardware threads the tool calls its CPU affinity


@dataclass(frozen=True)
class NicFact:
    """A network device; `gpus` are the GPUs it shares a PCIe switch or host bridge with."""

    name: str
    numa: int | None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class QueueFact:
    """A partition (Slurm) or queue (PBS, LSF); None where the tool did not say."""

    name: str
    max_walltime_s: int | None
    max_nodes: int | None
    default: bool = False


@dataclass(frozen=True)
class BatchFacts:
    """The batch system found, with what it says about its queues."""

    scheduler: str  # slurm, pbs, flux, lsf
    queues: tuple[QueueFact, ...] = ()
    slurm_mpi: str | None = None  # MpiDefault
    notes: tuple[str, ...] = ()  # one-line remarks written into the YAML as comments
