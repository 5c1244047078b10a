"""Lifecycle and introspection of `hpcring.torch`: init/shutdown, ranks, build flags, process sets, timeline.

Mirrors `horovod.torch`'s basics. `init()` starts the collective layer (which duplicates the communicator, so
a user's own mpi4py calls on COMM_WORLD stay independent of ours) and one background engine; it is idempotent,
and `init()` after `shutdown()` starts afresh. The `*_built()` functions answer before `init()`.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

from hpcring import _deps, malloc_policy
from hpcring.config import engine_settings
from hpcring.engine import Engine, OpType, ProcessSet, Request, Signature, global_process_set
from hpcring.errors import ConfigError, NotInitializedError
from hpcring.horovod_env import report_ignored
from hpcring.torch import wallclock

_lock = threading.RLock()
_engine: Engine | None = None
_static_sets: list[ProcessSet] = []
_dynamic_sets: dict[int, ProcessSet] = {}
_generation = 0  # incremented by every init(): auto-generated names restart with a new engine


def generation() -> int:
    """Which init() the running engine came from."""
    return _generation


def _collective() -> Any:
    from hpcring import collective

    return collective


def engine() -> Engine:
    """The running engine; ValueError (NotInitializedError) before init(), as Horovod."""
    e = _engine
    if e is None:
        raise NotInitializedError("hpcring.torch has not been initialized; call hvd.init() first")
    return e


def _as_process_set(item: ProcessSet | Sequence[int]) -> ProcessSet:
    return item if isinstance(item, ProcessSet) else ProcessSet(list(item))


def _comm_ranks(comm: Any, world: Any) -> list[int]:
    """The ranks (in `world`, the communicator hpcring was initialised over) of an mpi4py communicator."""
    from mpi4py import MPI

    group, world_group = comm.Get_group(), world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
    finally:
        group.Free()
        world_group.Free()
    if MPI.UNDEFINED in ranks:
        raise ConfigError(
            "a ProcessSet's communicator has ranks outside the communicator hpcring was initialised with"
        )
    return sorted(ranks)


def _static_plan(static: list[ProcessSet], world: Any) -> list[tuple[list[int], ProcessSet]]:
    """(ranks, object) of every static set, in registration order, identical on every rank.

    A set given as a communicator (Horovod's `ProcessSet(MPI.COMM_WORLD.Split(...))`) differs by rank: each
    rank's is its own part of the split. Every part becomes a set, in the order of the first rank holding it,
    and each rank's object is bound to its own part. A duplicate of an earlier set is a ValueError on every
    rank, as in Horovod."""
    mine = [_comm_ranks(ps.mpi_comm, world) for ps in static if ps.mpi_comm is not None]
    every: list[list[list[int]]] = world.allgather(mine)
    if len({len(lists) for lists in every}) != 1:
        raise ConfigError("init(process_sets=...) got a different number of communicator sets on some ranks")
    per_set = iter(zip(mine, zip(*every, strict=True), strict=True))  # (own part, every rank's) per set
    plan: list[tuple[list[int], ProcessSet]] = []
    for ps in static:
        if ps.mpi_comm is None:
            plan.append((ps.ranks, ps))
            continue
        own, parts = next(per_set)
        for ranks in map(list, dict.fromkeys(map(tuple, parts))):  # distinct, in order of first rank
            plan.append((ranks, ps if ranks == own else ProcessSet(ranks)))
    seen: set[tuple[int, ...]] = {tuple(range(world.Get_size()))}
    for i, (ranks, _) in enumerate(plan):
        if tuple(ranks) in seen:
            raise ValueError(f"process set {i + 1} (ranks {ranks}) duplicates an earlier process set")
        seen.add(tuple(ranks))
    return plan


def init(comm: Any = None, process_sets: Sequence[ProcessSet | Sequence[int]] | str | None = None) -> None:
    """Initialise hpcring over COMM_WORLD, an mpi4py communicator or a list of world ranks (idempotent).

    `process_sets`: ProcessSet objects (or rank lists) registered now, on every rank, in this order;
    "dynamic" (Horovod's switch) is accepted: `add_process_set` always works here.
    """
    global _engine, _generation
    with _lock:
        if _engine is not None and _engine.running:
            return
        if _engine is not None:  # stopped by a peer or a stall: start afresh
            _shutdown_locked()
        settings = engine_settings()
        malloc_policy.tune()  # before the first step allocates: see hpcring/malloc_policy.py
        sets = [] if process_sets is None or isinstance(process_sets, str) else list(process_sets)
        if isinstance(process_sets, str) and process_sets != "dynamic":
            raise ConfigError(
                f"init(process_sets={process_sets!r}): use a list of ProcessSet objects or 'dynamic'"
            )
        static = [_as_process_set(s) for s in sets]
        topo = _collective().init(comm)
        try:
            plan = _static_plan(static, topo.comm)
            _engine = Engine(topo, settings, [ranks for ranks, _ in plan])
        except BaseException:
            _collective().shutdown()
            raise
        global_process_set._register(0, list(range(topo.size)), topo.rank)
        for i, (ranks, ps) in enumerate(plan, start=1):
            ps._register(i, ranks, topo.rank)
        _static_sets[:] = [ps for _, ps in plan]
        _generation += 1
        report_ignored(topo.rank)  # HOROVOD_* settings hpcring does not act on: once, on rank 0
        wallclock.install_if_configured()  # a job with --checkpoint-dir: record a warning from now on


def _shutdown_locked() -> None:
    global _engine
    if _engine is not None:
        _engine.shutdown()
        _engine = None
    for ps in [*_static_sets, *_dynamic_sets.values()]:
        ps._invalidate()
    _static_sets.clear()
    _dynamic_sets.clear()
    global_process_set.ranks = []
    global_process_set._my_rank = None
    _collective().shutdown()


def shutdown() -> None:
    """Stop the engine (pending ops on every rank fail with HorovodInternalError) and free our comms."""
    with _lock:
        _shutdown_locked()


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _engine is not None


def _topology() -> Any:
    engine()
    return _collective().topology()


def size() -> int:
    """Number of ranks."""
    return int(_topology().size)


def rank() -> int:
    """This process's rank."""
    return int(_topology().rank)


def local_size() -> int:
    """Ranks on this node."""
    return int(_topology().local_size)


def local_rank() -> int:
    """Rank among the ranks on this node."""
    return int(_topology().local_rank)


def cross_size() -> int:
    """Nodes that have a rank with this local rank."""
    return int(_topology().cross_size)


def cross_rank() -> int:
    """Rank among the ranks with this local rank (the node index on equal nodes)."""
    return int(_topology().cross_rank)


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks."""
    return bool(_topology().is_homogeneous)


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE (user MPI calls may overlap the engine's)."""
    engine()
    MPI = _deps.mpi()
    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def mpi_built() -> bool:
    """mpi4py (hence an MPI library) is installed; answers before init()."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """MPI carries the collectives of the running job (always, once initialised)."""
    return is_initialized()


def gloo_built() -> bool:
    """hpcring has no Gloo controller (MPI launches everything)."""
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> bool:
    """torch's NCCL backend is available (GPU tensors then move through NCCL inside a node)."""
    torch = _deps.torch()
    return bool(
        torch.cuda.is_available()
        and torch.distributed.is_available()
        and torch.distributed.is_nccl_available()
    )


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def cuda_built() -> bool:
    """torch was built with CUDA."""
    return _deps.torch().version.cuda is not None


def rocm_built() -> bool:
    """torch was built with ROCm."""
    return getattr(_deps.torch().version, "hip", None) is not None


# ---------------------------------------------------------------------- control operations


def _control(op_type: OpType, name: str, extra: tuple[int, ...] = ()) -> Any:
    req = Request(Signature(name, op_type, extra=extra), 0)
    return engine().submit(req).wait()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set at run time; every rank calls this, with the same ranks, in the same order."""
    ps = _as_process_set(process_set)
    if ps.mpi_comm is not None and ps.process_set_id is None:
        raise NotImplementedError(
            "adding a process set defined by an MPI communicator at run time is not implemented (nor in "
            "Horovod): pass it to init(process_sets=[...]), or add it as a list of ranks"
        )
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    e = engine()
    if e.find_set(ps.ranks) is not None:
        raise ValueError(f"a process set with ranks {ps.ranks} is already registered")
    # One fixed name: ranks adding different sets meet in negotiation and get the mismatch on every rank.
    set_id = _control(OpType.ADD_PROCESS_SET, "add_process_set", tuple(ps.ranks))
    ps._register(int(set_id), ps.ranks, rank())
    _dynamic_sets[ps.process_set_id or 0] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank (collective); False when it was not registered, and for the
    global process set, which is never removed (as Horovod answers)."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    _control(OpType.REMOVE_PROCESS_SET, "remove_process_set", (set_id,))
    process_set._invalidate()
    _dynamic_sets.pop(set_id, None)
    if process_set in _static_sets:
        _static_sets.remove(process_set)
    return True


def join(device: int = -1) -> int:
    """Signal that this rank has no more data; until every rank joined, its allreduces contribute zeros.

    Returns the rank that joined last (the same on every rank). `device` is accepted for compatibility.
    """
    del device
    return int(_control(OpType.JOIN, "join"))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the process set has called barrier (ranks that joined count as arrived).

    One fixed name per set, as Horovod's: a barrier is synchronous, so a rank has at most one in flight, and
    a count in the name would let ranks that called barrier a different number of times (under join) wait
    on different names forever."""
    req = Request(Signature("barrier", OpType.BARRIER), _set_id(process_set))
    engine().submit(req).wait()


def _set_id(process_set: ProcessSet | None) -> int:
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(ps).__name__}")
    if ps.process_set_id is None:
        raise ValueError(
            f"{ps} is not registered: pass it to hvd.init(process_sets=...) or hvd.add_process_set()"
        )
    return ps.process_set_id


def registered_process_sets() -> list[ProcessSet]:
    """The process sets registered since init() (static, then added), the global set left out."""
    return [*_static_sets, *_dynamic_sets.values()]


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record a Chrome-trace timeline to `file_path` (written by rank 0; "{rank}" makes one per rank)."""
    engine().start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording and close the timeline file."""
    engine().stop_timeline()
