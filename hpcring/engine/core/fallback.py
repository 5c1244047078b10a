"""The pure-Python request path: what the compiled core (`_core`) does, in Python, with the same behaviour.

Chosen by `hpcring/engine/core/__init__.py` when the extension is absent (a machine with no C compiler) or
when HPCRING_PURE_PYTHON=1 asks for it. Every test runs against both (docs/dev/testing.md).
"""

from __future__ import annotations

import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

NDArray = np.ndarray[Any, Any]

if TYPE_CHECKING:
    from hpcring.engine.request import Signature

# Completion is a single hand-off: a waiting caller sleeps on its own "gate" lock, registered under
# `_registry`; the engine marks a whole batch of handles done under `_registry`, lets go of it, and only then
# opens the gates. (A per-handle Event is costly to create; and any Condition wakes the waiter while the
# notifier still holds the condition's lock, so the waiter wakes, blocks on that lock and is woken a second
# time, an extra switch that a crowded CPU makes expensive: docs/dev/engine.md, "Cost of a request".)
_registry = threading.Lock()


class Handle:
    """Completion of one request: set once by the engine thread, waited on by the caller."""

    __slots__ = ("_done", "_error", "_gates", "_result", "event", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        # Device routes: the event recorded on the communication stream after the request's batch. The
        # handle completes when the work is queued; whoever consumes the result waits for this event.
        self.event: Any = None
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._gates: list[threading.Lock] | None = None  # locks of the threads blocked in wait()

    def done(self) -> bool:
        """True once the result (or error) is available; never blocks."""
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result, or raise the error the engine recorded for this request."""
        if not self._done and not self._block(timeout):
            raise TimeoutError(f"request {self.name!r} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _block(self, timeout: float | None) -> bool:
        """Sleep until `complete()` opens this thread's gate; False on timeout."""
        gate = threading.Lock()
        gate.acquire()
        with _registry:
            if self._done:
                return True
            if self._gates is None:
                self._gates = [gate]
            else:
                self._gates.append(gate)
        if gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return True
        with _registry:
            if self._done:  # completed just as the wait timed out
                return True
            if self._gates is not None:
                self._gates.remove(gate)
        return False

    def set_result(self, result: Any) -> None:
        complete([self], [result])

    def set_error(self, error: BaseException) -> None:
        complete([self], None, error)


def complete(
    handles: Sequence[Handle], results: Sequence[Any] | None, error: BaseException | None = None
) -> None:
    """Finish many handles with one pass: results (or the shared error) are stored, every handle is marked
    done under one lock round, and the blocked callers are woken after that lock is released.

    The per-handle stores run as C-level `map(setattr, ...)` passes drained by a zero-length deque: a fused
    batch completes hundreds of handles, and a Python loop costs a few hundred ns per handle more.
    """
    if len(handles) == 1:
        _complete_one(handles[0], results, error)
        return
    if error is not None:
        drain(map(setattr, handles, repeat("_error"), repeat(error)))
    else:
        assert results is not None
        if len(results) != len(handles):
            raise ValueError(f"{len(results)} results for {len(handles)} handles")
        drain(map(setattr, handles, repeat("_result"), results))
    with _registry:
        drain(map(setattr, handles, repeat("_done"), repeat(True)))
        waiting = list(filter(None, map(_GATES, handles)))  # usually one list: the caller waits on one handle
        if waiting:
            drain(map(setattr, handles, repeat("_gates"), repeat(None)))
    for gates in waiting:
        for gate in gates:
            gate.release()


def _complete_one(h: Handle, results: Sequence[Any] | None, error: BaseException | None) -> None:
    """`complete` for a single handle (the latency path), without the C-level passes' setup."""
    if error is not None:
        h._error = error
    else:
        assert results is not None
        if len(results) != 1:
            raise ValueError(f"{len(results)} results for 1 handles")
        h._result = results[0]
    with _registry:
        h._done = True
        gates, h._gates = h._gates, None
    if gates:
        for gate in gates:
            gate.release()


_GATES = operator.attrgetter("_gates")
drain = deque[Any](maxlen=0).extend  # consumes an iterator in C, keeping nothing


class Request:
    """One queued collective on this rank.

    `tensor` is the input; `output` a preallocated result buffer where the op has a fixed output shape
    (allreduce, broadcast; it may be `tensor` itself for in-place ops); `splits` the alltoall send counts.
    A slotted class with a plain `__init__`: one is built per tensor per step.
    """

    __slots__ = ("handle", "output", "process_set_id", "ready", "sig", "splits", "submitted_at", "tensor")

    def __init__(
        self,
        sig: Signature,
        process_set_id: int,
        tensor: NDArray | None = None,
        output: NDArray | None = None,
        splits: NDArray | None = None,
        handle: Handle | None = None,
        submitted_at: float | None = None,
        ready: Any = None,
    ) -> None:
        self.sig = sig
        self.process_set_id = process_set_id
        self.tensor = tensor
        self.output = output
        self.splits = splits
        if handle is None:
            handle = Handle(sig.name)
        elif not handle.name:
            handle.name = sig.name
        self.handle = handle
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.ready = ready  # device routes: an event on the stream that produced the tensor

    def __repr__(self) -> str:
        return f"Request({self.sig!r}, process_set_id={self.process_set_id})"


class Pending:
    """What synchronize() needs for one handle: the engine handles, how to build the result, and the inputs
    kept alive until completion. Slotted with a plain __init__: one is built per async op."""

    __slots__ = ("finish", "handles", "keep")

    def __init__(
        self, handles: list[Handle], finish: Callable[[list[Any]], Any] | None, keep: Any = None
    ) -> None:
        self.handles = handles
        self.finish = finish
        self.keep = keep

    def result(self, results: list[Any]) -> Any:
        """finish(results), or `keep` itself when there is no finish (an op whose result is its output)."""
        if self.finish is None:
            return self.keep
        return self.finish(results)


# The engine lock. The compiled core's Lock has the same interface and is taken in C by its submit.
Lock = threading.Lock
