"""What the engine queues: a named request, the signature all ranks must agree on, and the caller's handle.

The engine knows numpy arrays and metadata only; framework adapters (`hpcring.torch`) turn tensors into
zero-copy numpy views before they submit and turn results back into tensors afterwards.
"""

from __future__ import annotations

import enum
import math
from typing import Any, NamedTuple

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
    TUNE = "tune"  # new fusion threshold and cycle time, applied at one point of the op sequence everywhere


# Requests whose signature can live in the response cache (the steady-state fast path).
CACHEABLE = frozenset(
    {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.REDUCESCATTER}
)


class Signature(NamedTuple):
    """The part of a request every rank of the process set must agree on; small, hashable and picklable.

    `shape` has -1 as its first entry for allgather/alltoall (dim 0 may differ per rank). `extra` carries
    op-specific agreed data (the ranks of a new process set, the id of one to remove). A NamedTuple rather
    than a frozen dataclass: a training step builds one per tensor, and tuple construction and comparison
    (the response-cache lookup) run in C, several times faster than a frozen dataclass's `__init__`/`__eq__`.
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

    @property
    def numel(self) -> int:
        """Elements in the agreed shape (0 for ragged ops, whose first dimension is not agreed)."""
        n = math.prod(self.shape)  # negative only with a ragged (-1) first dimension
        return n if n > 0 else 0


def signature_shape(op_type: OpType, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape as agreed: ragged ops keep only the trailing dimensions."""
    # Allgather and alltoall: the first dimension may differ between ranks. Compared by identity, not looked
    # up in a set: hashing an Enum runs Python code, and this runs once per submitted tensor.
    if shape and (op_type is OpType.ALLGATHER or op_type is OpType.ALLTOALL):
        return (-1, *shape[1:])
    return tuple(shape)


# Handle, Request and complete come from the request path's core: compiled, or its pure-Python twin.
from hpcring.engine.core import Handle, Request, complete, drain  # noqa: E402

__all__ = ["CACHEABLE", "Handle", "OpType", "Request", "Signature", "complete", "drain", "signature_shape"]
