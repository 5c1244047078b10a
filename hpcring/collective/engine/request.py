"""What the engine queues: a named request, the signature all ranks must agree on, and the caller's handle.

The engine knows numpy arrays and metadata only; framework adapters (`hpcring.torch`) turn tensors into
zero-copy numpy views before they submit and turn results back into tensors afterwards.
"""

from __future__ import annotations

import enum
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NDArray = np.ndarray[Any, Any]


class OpType(enum.Enum):
    """Kinds of request; the value is the lower-case name used in messages and the timeline."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"
    ADD_PROCESS_SET = "add_process_set"
    REMOVE_PROCESS_SET = "remove_process_set"


# Requests whose signature can live in the response cache (the steady-state fast path).
CACHEABLE = frozenset(
    {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.REDUCESCATTER}
)
# Requests whose first dimension may differ between ranks: the signature keeps only the trailing dimensions.
RAGGED = frozenset({OpType.ALLGATHER, OpType.ALLTOALL})


@dataclass(frozen=True)
class Signature:
    """The part of a request every rank of the process set must agree on; small, hashable and picklable.

    `shape` has -1 as its first entry for allgather/alltoall (dim 0 may differ per rank). `extra` carries
    op-specific agreed data (the ranks of a new process set, the id of one to remove).
    """

    name: str
    op_type: OpType
    dtype: str = ""
    shape: tuple[int, ...] = ()
    reduce_op: str = ""
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    device: str = "cpu"
    extra: tuple[int, ...] = ()

    @functools.cached_property
    def count(self) -> int:
        """Elements in the agreed shape (0 for ragged ops, whose first dimension is not agreed)."""
        n = 1
        for d in self.shape:
            n *= max(d, 0)
        return n


def signature_shape(op_type: OpType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape as agreed: ragged ops keep only the trailing dimensions."""
    if op_type in RAGGED and shape:
        return (-1, *shape[1:])
    return tuple(shape)


class Handle:
    """Completion of one request: set once by the engine thread, waited on by the caller."""

    __slots__ = ("_error", "_event", "_result", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the result (or error) is available; never blocks."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result, or raise the error the engine recorded for this request."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"request {self.name!r} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def set_result(self, result: Any) -> None:
        self._result = result
        self._event.set()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._event.set()


@dataclass(eq=False)
class Request:
    """One queued collective on this rank.

    `tensor` is the input; `output` a preallocated result buffer where the op has a fixed output shape
    (allreduce, broadcast; it may be `tensor` itself for in-place ops); `splits` the alltoall send counts.
    """

    sig: Signature
    process_set_id: int
    tensor: NDArray | None = None
    output: NDArray | None = None
    splits: NDArray | None = None
    handle: Handle = field(default_factory=lambda: Handle(""))
    submitted_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.handle.name:
            self.handle.name = self.sig.name
