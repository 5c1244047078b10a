"""The caller runs the cycle: a lone synchronous op does not pay two thread hand-offs.

A synchronous op (`hvd.allreduce(x)`) on an idle engine would go: the caller queues the request and wakes the
engine thread, blocks; the engine thread wakes, runs the cycle, completes the handle and wakes the caller.
Each hand-off is an OS switch plus the GIL, a large share of a small op's latency (docs/dev/engine.md, "The
waiting thread runs the cycle").

So a thread about to block on a handle first tries to run the cycle itself: when the request is the only one
this rank has in flight, it is small (INLINE_MAX_BYTES), no timeline is recording, and no cycle is running,
the caller takes the cycle lock and runs cycles, paced like the engine thread's, until its handle is done.
Cycles are collective and pair by order, not by thread, so the peers cannot tell who ran them. Only one
thread runs a cycle at a time: the engine thread takes the same lock around each of its cycles, and after a
wake-up whose work a caller already did it goes back to sleep instead of cycling.

What the engine thread would do with the end of a cycle, the caller hands to it: when the cycle says the
engine must stop (a peer shut down, a stall abort) or raises, the reason is stored and the engine thread,
woken, stops exactly as if its own cycle had said so, failing every pending handle. Work left in flight
after the caller's handle is done (another thread's request) wakes the engine thread too.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from hpcring.engine.engine_state import EngineState
from hpcring.engine.request import Handle

# Largest request a waiting thread runs itself: the latency path is for small ops, and a large one would make
# the collective algorithms build a second set of per-thread scratch buffers on the caller's thread.
INLINE_MAX_BYTES = 64 << 10


class _Deferral(threading.local):
    """Per thread: are this thread's submits leaving the engine thread asleep (`deferred_wake`)? A
    class-level default, so that a thread that never set it reads it without an AttributeError inside."""

    on = False


_defer = _Deferral()
# One entry per thread inside `deferred_wake` (append and pop are atomic under the GIL): while it is empty,
# no thread defers, and the submit skips the thread-local read, which costs more than its other checks.
_deferring: list[None] = []


def wake_deferred() -> bool:
    """True inside `deferred_wake` on this thread (Engine.submit then queues without a wake-up token)."""
    return bool(_deferring) and _defer.on


class _DeferredWake:
    """`CallerCycles.deferred_wake`'s block: a plain context manager (cheaper than a generator-based one on
    every synchronous op)."""

    __slots__ = ("_wake",)

    def __init__(self, wake: queue.SimpleQueue[None]) -> None:
        self._wake = wake

    def __enter__(self) -> None:
        _defer.on = True
        _deferring.append(None)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        _defer.on = False
        _deferring.pop()
        if kind is not None:
            self._wake.put(None)  # nobody will wait for what was queued: let the engine thread run it


class _Ended(Exception):
    """An inline cycle said the engine must stop (the engine thread stops at its next turn)."""


class CallerCycles:
    """The cycle lock, and cycles run by a thread waiting for its own lone request."""

    def __init__(self, state: EngineState, wake: queue.SimpleQueue[None], cycle: Callable[[], bool]) -> None:
        """`wake`: the engine thread's wake-up queue; `cycle`: one negotiation cycle, True when the engine
        must stop."""
        self._state = state
        self._wake = wake
        self._cycle = cycle
        self.lock = threading.Lock()  # held by whichever thread runs a cycle
        self._end: BaseException | None = None  # set by an inline cycle that ended the engine

    def nothing_to_do(self) -> bool:
        """For the engine thread after a submit woke it: the submitter already ran the cycle and nothing
        else is in flight, so no cycle is needed."""
        state = self._state
        with state.lock:
            return not state.closed and not state.work_pending()

    def _lone_request(self, handle: Handle) -> bool:
        """The handle's request is this rank's only request in flight, a small request not yet taken in by
        a cycle (engine lock held by the caller). Device requests too: their batch queues its work on a
        communication stream and returns, whichever thread runs it."""
        found = None
        for st in self._state.sets.values():
            if not st.inflight:
                continue
            if found is not None or len(st.inflight) != 1 or len(st.incoming) != 1:
                return False
            found = st.incoming[0]
        if found is None or found.handle is not handle:
            return False
        nbytes = getattr(found.tensor, "nbytes", None)
        return nbytes is not None and nbytes <= INLINE_MAX_BYTES

    def deferred_wake(self) -> _DeferredWake:
        """Requests submitted by this thread inside the block do not wake the engine thread: the caller is
        about to wait for them and `run_inline(..., deferred=True)` (which wakes it when it does not run the
        cycle) comes next."""
        return _DeferredWake(self._wake)

    def run_inline(self, handle: Handle, deferred: bool = False) -> None:
        """Run cycles on this thread until `handle` is done, when that is allowed (see the module); return at
        once otherwise, and the caller blocks in `handle.wait()` as usual. `deferred`: the request was queued
        inside `deferred_wake`, so the engine thread must be woken when this thread does not run it."""
        if handle.done():
            return
        state = self._state
        if state.timeline is None and self._one_in_flight() and self.lock.acquire(blocking=False):
            try:
                with state.lock:
                    allowed = not state.closed and self._end is None and self._lone_request(handle)
                if allowed:
                    state.stats["inline"] += 1
                    self._cycles_until(handle)
            finally:
                self.lock.release()
            with state.lock:  # what is left (another thread's request, a stop) is the engine thread's
                left = state.work_pending() or self._end is not None
            if left:
                self._wake.put(None)
        elif deferred:
            self._wake.put(None)

    def _one_in_flight(self) -> bool:
        """A lock-free first look (dict sizes): exactly one request in flight on this rank. The full check
        runs under the locks; this keeps a wait among many in flight from taking them at all."""
        return sum(len(st.inflight) for st in list(self._state.sets.values())) == 1

    def _cycles_until(self, handle: Handle) -> None:
        """The engine thread's loop, run by the caller (cycle lock held) until its handle is done."""
        state = self._state
        while not handle.done():
            start = time.monotonic()
            try:
                ended = self._cycle()
            except Exception as exc:  # the engine thread reports it and stops, failing this handle too
                self._end = exc
                return
            except BaseException as exc:  # Ctrl-C in the caller: the engine stops, the caller sees it
                self._end = exc
                raise
            if ended:
                self._end = _Ended()
                return
            if handle.done():
                return
            with state.lock:
                if state.closed:
                    return
            delay = start + state.settings.cycle_time_ms / 1000.0 - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def take_end(self) -> bool:
        """For the engine thread, before a cycle: True when an inline cycle ended the engine; re-raises what
        an inline cycle raised (cycle lock held)."""
        end, self._end = self._end, None
        if end is None:
            return False
        if isinstance(end, _Ended):
            return True
        raise end
