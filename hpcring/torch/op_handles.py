"""Horovod's reduce ops, names and integer handles: what `poll()` and `synchronize()` work on, and how a
grouped call's requests are queued together."""

from __future__ import annotations

import itertools
import operator
import threading
import warnings
from collections.abc import Callable
from typing import Any

from hpcring import _deps
from hpcring.collective.ops import ReduceOp
from hpcring.engine import Handle, ProcessSet
from hpcring.engine.core import Pending
from hpcring.errors import CollectiveError, ConfigError
from hpcring.torch import basics

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command


HorovodInternalError = CollectiveError

Average = ReduceOp.AVERAGE

Sum = ReduceOp.SUM

Min = ReduceOp.MIN

Max = ReduceOp.MAX

Product = ReduceOp.PRODUCT


class _AdasumOp:
    """Horovod's Adasum reduction (`allreduce` and `DistributedOptimizer`; `adasum_rules.py` says where it is
    allowed). Not a ReduceOp: it is not element-wise, so the collective floor's element-wise paths never
    see it; requests carry it as the reduce op "adasum"."""

    def __repr__(self) -> str:
        return "Adasum"


Adasum = _AdasumOp()

ADASUM = "adasum"  # a request's reduce op for Adasum (engine/host_adasum.py)

_OPS = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "product"}
# The same by the op's identity: looking an Enum member up in a dict hashes it in Python, once per call.
_OP_NAMES = {id(op): name for op, name in _OPS.items()}


def handle_average_backwards_compatibility(op: Any, average: Any) -> Any:
    """Horovod's rule: `average=` is deprecated; both given is a ValueError; neither means Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            2,
        )
        return Average if average else Sum
    return Average


def _op_name(op: Any, what: str) -> str:
    if op is Adasum:
        return ADASUM
    if isinstance(op, ReduceOp):
        return _OP_NAMES[id(op)]
    raise ConfigError(
        f"{what}: unknown op {op!r}; allowed: hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product or "
        "hvd.Adasum"
    )


# ---------------------------------------------------------------------- handles


# What synchronize() needs for one handle (the core's: compiled, or its Python twin).
_Pending = Pending


_handle_map: dict[int, _Pending] = {}

_handle_ids = itertools.count(1)

_names_lock = threading.Lock()

_noname: dict[tuple[int, int, str], itertools.count[int]] = {}


def _name(prefix: str, name: str | None, process_set: ProcessSet | None = None) -> str:
    """Horovod's naming: `<op>.<name>`, or `<op>.noname.<n>` counting per op kind and process set (so ops on
    a set a rank is not in do not shift its numbering) and per init() (a re-initialised job starts at 0)."""
    if name is not None:
        return f"{prefix}.{name}"
    key = (basics.generation(), basics._set_id(process_set), prefix)
    with _names_lock:
        counter = _noname.setdefault(key, itertools.count())
        return f"{prefix}.noname.{next(counter)}"


def _register(pending: _Pending) -> int:
    handle = next(_handle_ids)
    _handle_map[handle] = pending
    return handle


def poll(handle: int) -> bool:
    """True when the operation finished (synchronize() will not block)."""
    pending = _handle_map.get(handle)
    if pending is None:
        raise ValueError(f"unknown handle {handle!r} (already synchronized?)")
    return all(h.done() and (h.event is None or h.event.query()) for h in pending.handles)


def wait_now(start: Callable[[], Any]) -> Any:
    """Start an op and wait for it at once (the synchronous ops): queued without waking the engine thread, so
    that this thread can run the cycle itself when the engine is idle (engine/caller_cycles.py)."""
    engine = basics._engine
    if engine is None:
        return synchronize(start())
    with engine.deferred_wake():
        handle = start()
    pending = _handle_map.get(handle)
    if pending is not None and len(pending.handles) == 1:
        engine.run_inline(pending.handles[0], True)  # deferred; positional for the C twin
    else:  # a group (or an op that queued nothing): the engine thread runs it
        engine.wake()
    return synchronize(handle)


# The compiled core's synchronize for int handles (set by one_call.py when the core is built, else None):
# one C call that waits with the GIL released; the Python below is its twin and handles everything else.
_core_synchronize: Callable[[int], Any] | None = None


def synchronize(handle: Any) -> Any:
    """Wait for an async operation and return its output (HorovodInternalError if it failed on the ranks)."""
    if _core_synchronize is not None and type(handle) is int:
        return _core_synchronize(handle)
    if callable(handle):  # sparse_allreduce_async returns a closure, as Horovod
        return handle()
    pending = _handle_map.pop(handle, None)
    if pending is None:
        return None
    handles = pending.handles
    if len(handles) == 1 and not handles[0].done():
        _run_inline(handles[0])
    results = [h.wait() for h in handles]
    if len(handles) == 1:  # one op: a plain check
        if handles[0].event is not None:
            _after_device(handles)
    elif list(map(_EVENT, handles)).count(None) != len(handles):  # a device op: its stream's events
        _after_device(handles)
    return pending.result(results)


_EVENT = operator.attrgetter("event")


def _run_inline(handle: Handle) -> None:
    """A lone request's waiter runs its cycle itself when `run_inline`'s checks allow it, as a synchronous
    op's does (`wait_now`), instead of sleeping until the engine thread has taken the GIL and run it (the
    submit woke that thread, which then finds nothing to do)."""
    engine = basics._engine
    if engine is not None:
        engine.run_inline(handle)


def _after_device(handles: list[Handle]) -> None:
    """Device ops: wait for the communication stream's completion events before the results are used. By
    default on the CPU, so results are readable from any stream afterwards; under
    HOROVOD_ENABLE_ASYNC_COMPLETION the caller's current stream waits instead (the CPU goes on queueing
    work), and results are readable from that stream."""
    events = {id(h.event): h.event for h in handles if h.event is not None}
    engine = basics._engine
    asynchronous = engine is not None and engine.settings.async_completion
    torch = _deps.torch()
    for event in events.values():
        if asynchronous:
            torch.cuda.current_stream().wait_event(event)
        else:
            event.synchronize()


class _Batch(threading.local):
    """Per thread: the requests of the grouped call being built (`_submit_group`), else None. A class-level
    default, not `getattr(local, "batch", None)`: that raises and catches an AttributeError inside on every
    submit of a thread that never grouped (docs/dev/engine.md, "Cost of a request")."""

    batch: list[Any] | None = None


_tls = _Batch()

# The compiled core's count of grouped calls being built (set by one_call.py, else None): its submit reads
# `_tls` only while one is open on some thread.
_core_group: Callable[[int], Any] | None = None


def _submit_group(make: Callable[[], list[int]]) -> int:
    """Run `make` (which calls the single-tensor *_async functions) and queue all its requests atomically, so
    the group is negotiated, and fused, as one unit; returns one handle for the list of results."""
    counted = _core_group
    if counted is not None:
        counted(1)
    _tls.batch = []
    handles: list[int] = []
    try:
        handles = make()
        basics.engine().submit_many(_tls.batch)
    except BaseException:
        for h in handles:
            _handle_map.pop(h, None)
        raise
    finally:
        _tls.batch = None
        if counted is not None:
            counted(-1)
    return _grouped(handles)


def _grouped(handles: list[int]) -> int:
    pendings = [_handle_map.pop(h) for h in handles]

    def finish(results: list[Any]) -> Any:
        out, i = [], 0
        for p in pendings:
            k = len(p.handles)
            out.append(p.result(results[i : i + k]))
            i += k
        return tuple(out)  # Horovod's synchronize() of a grouped handle returns a tuple

    return _register(_Pending([h for p in pendings for h in p.handles], finish))


def _group_names(prefix: str, name: str | None, n: int, process_set: ProcessSet | None) -> list[str | None]:
    """`<name>.<i>` per member; unnamed groups get `grouped.noname.<k>.<i>`."""
    if name is None:
        base = _name(f"grouped_{prefix}", None, process_set).removeprefix(f"grouped_{prefix}.")
        return [f"grouped.{base}.{i}" for i in range(n)]
    return [f"{name}.{i}" for i in range(n)]
