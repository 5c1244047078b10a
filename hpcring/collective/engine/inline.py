"""The caller runs the cycle: a lone synchronous op does not pay two thread hand-offs.

A synchronous op (`hvd.allreduce(x)`) on an idle engine used to go: the caller queues the request and wakes
the engine thread, blocks; the engine thread wakes (one OS hand-off plus the GIL), runs the cycle, completes
the handle and opens the caller's gate (a second hand-off). On the CI machine a hand-off round trip is
13 us median of the 33-35 us such an op cost (docs/engine.md, "Issue 13").

Now a thread about to block on a handle first tries to run the cycle itself: when the request is the only
one this rank has in flight, it is a host (numpy) request of 64 KiB at most, no timeline is recording, and
no cycle is running, the caller takes the cycle lock and runs cycles, paced like the engine thread's, until
its handle is done. Cycles are collective and pair by order, not by thread, so the peers cannot tell who
ran them. Only one thread runs a cycle at a time: the engine thread takes the same lock around each of its
cycles, and after a wake-up whose work a caller already did it goes back to sleep instead of cycling.

What the engine thread would do with the end of a cycle, the caller hands to it: when the cycle says the
engine must stop (a peer shut down, a stall abort) or raises, the reason is stored and the engine thread,
woken, stops exactly as if its own cycle had said so, failing every pending handle. Work left in flight
after the caller's handle is done (another thread's request) wakes the engine thread too.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from hpcring.collective.engine.request import Handle

if TYPE_CHECKING:
    import queue

    from hpcring.collective.engine.state import _SetState
    from hpcring.collective.engine.timeline import Timeline
    from hpcring.config import EngineSettings


# Largest request a waiting thread runs itself. The latency path is for small ops; a large one would make the
# collective algorithms build a second set of per-thread scratch buffers (workspace.py) on the caller's
# thread, and its data time dwarfs the hand-off anyway.
INLINE_MAX_BYTES = 64 << 10


class _Deferral(threading.local):
    """Per thread: are this thread's submits leaving the engine thread asleep (`deferred_wake`)? The
    class-level default answers a thread that never set it: `getattr(local, name, default)` on a missing
    attribute raises and catches an AttributeError inside, 0.3 us on every submit."""

    on = False


_defer = _Deferral()


def wake_deferred() -> bool:
    """True inside `deferred_wake` on this thread (Engine.submit then queues without a wake-up token)."""
    return _defer.on


class _DeferredWake:
    """`Inline.deferred_wake`'s block: a plain context manager (a generator-based one costs a microsecond
    more, on every synchronous op)."""

    __slots__ = ("_wake",)

    def __init__(self, wake: queue.SimpleQueue[None]) -> None:
        self._wake = wake

    def __enter__(self) -> None:
        _defer.on = True

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        _defer.on = False
        if kind is not None:
            self._wake.put(None)  # nobody will wait for what was queued: let the engine thread run it


class _Ended(Exception):
    """An inline cycle said the engine must stop (the engine thread stops at its next turn)."""


class Inline:
    """Mixed into `Engine`: the cycle lock and the caller-run cycle."""

    _lock: threading.Lock
    _wake: queue.SimpleQueue[None]
    _sets: dict[int, _SetState]
    _closed: bool
    _timeline: Timeline | None
    settings: EngineSettings
    stats: dict[str, int]

    def _init_inline(self) -> None:
        self._cycle_lock = threading.Lock()  # held by whichever thread runs a cycle
        self._inline_end: BaseException | None = None  # set by an inline cycle that ended the engine

    def _cycle(self) -> bool:  # pragma: no cover - provided by Engine
        raise NotImplementedError

    def _work_pending(self) -> bool:
        """Anything in flight on this rank (engine lock held by the caller)."""
        return any(st.inflight for st in self._sets.values())

    def _nothing_to_do(self) -> bool:
        """For the engine thread after a submit woke it: the submitter already ran the cycle (inline) and
        nothing else is in flight, so no cycle is needed."""
        with self._lock:
            return not self._closed and not self._work_pending()

    def _lone_request(self, handle: Handle) -> bool:
        """The handle's request is this rank's only request in flight, a small host request not yet taken
        in by a cycle (engine lock held by the caller)."""
        found = None
        for st in self._sets.values():
            if not st.inflight:
                continue
            if found is not None or len(st.inflight) != 1 or len(st.incoming) != 1:
                return False
            found = st.incoming[0]
        if found is None or found.handle is not handle or found.sig.device != "cpu":
            return False
        nbytes = getattr(found.tensor, "nbytes", None)
        return nbytes is not None and nbytes <= INLINE_MAX_BYTES

    def deferred_wake(self) -> _DeferredWake:
        """Requests submitted by this thread inside the block do not wake the engine thread: the caller is
        about to wait for them and `run_inline(..., deferred=True)` (which wakes it when it does not run the
        cycle) comes next. Saves a spurious wake-up of the engine thread per synchronous op."""
        return _DeferredWake(self._wake)

    def run_inline(self, handle: Handle, deferred: bool = False) -> None:
        """Run cycles on this thread until `handle` is done, when that is allowed (see the module); return at
        once otherwise, and the caller blocks in `handle.wait()` as usual. `deferred`: the request was queued
        inside `deferred_wake`, so the engine thread must be woken when this thread does not run it."""
        if handle.done():
            return
        if self._timeline is None and self._one_in_flight() and self._cycle_lock.acquire(blocking=False):
            try:
                with self._lock:
                    allowed = not self._closed and self._inline_end is None and self._lone_request(handle)
                if allowed:
                    self.stats["inline"] += 1
                    self._cycles_until(handle)
            finally:
                self._cycle_lock.release()
            with self._lock:  # what is left (another thread's request, a stop) is the engine thread's
                left = self._work_pending() or self._inline_end is not None
            if left:
                self._wake.put(None)
        elif deferred:
            self._wake.put(None)

    def wake(self) -> None:
        """Wake the engine thread (after `deferred_wake`, when the caller does not run the cycle itself)."""
        self._wake.put(None)

    def _one_in_flight(self) -> bool:
        """A lock-free first look (dict sizes): exactly one request in flight on this rank. The full check
        runs under the locks; this keeps a wait among many in flight from taking them at all."""
        return sum(len(st.inflight) for st in list(self._sets.values())) == 1

    def _cycles_until(self, handle: Handle) -> None:
        """The engine thread's loop, run by the caller (cycle lock held) until its handle is done."""
        period = self.settings.cycle_time_ms / 1000.0
        while not handle.done():
            start = time.monotonic()
            try:
                ended = self._cycle()
            except Exception as exc:  # the engine thread reports it and stops, failing this handle too
                self._inline_end = exc
                return
            except BaseException as exc:  # Ctrl-C in the caller: the engine stops, the caller sees it
                self._inline_end = exc
                raise
            if ended:
                self._inline_end = _Ended()
                return
            if handle.done():
                return
            with self._lock:
                if self._closed:
                    return
            delay = start + period - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def _take_inline_end(self) -> bool:
        """For the engine thread, before a cycle: True when an inline cycle ended the engine; re-raises what
        an inline cycle raised (cycle lock held)."""
        end, self._inline_end = self._inline_end, None
        if end is None:
            return False
        if isinstance(end, _Ended):
            return True
        raise end
