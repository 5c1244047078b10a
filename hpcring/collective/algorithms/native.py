"""Native allreduce: the transport's own collective (MPI_Allreduce on CPU).

MPI cannot add float16 or bfloat16, so those are widened to float32, reduced there and rounded back once: the
result is at least as accurate as adding in the dtype itself, at twice the bytes on the wire.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcring.collective.algorithms.workspace import scratch
from hpcring.collective.backends.base import Transport
from hpcring.collective.dtypes import accumulator, name_of
from hpcring.collective.ops import ReduceOp
from hpcring.errors import CollectiveError

NDArray = np.ndarray[Any, Any]


def native_allreduce(t: Transport, src: NDArray, dst: NDArray, op: ReduceOp) -> None:
    """dst = reduction of every rank's src (1-D; dst may be src) with `op`'s base operator."""
    if src.size == 0:
        return
    if t.can_reduce(src.dtype, op):
        if dst is src:
            t.allreduce(dst, op)
        else:
            t.allreduce(dst, op, sendbuf=src)
        return
    acc = accumulator(src.dtype)
    if acc == src.dtype or not t.can_reduce(acc, op):
        raise CollectiveError(f"the native backend cannot reduce {name_of(src.dtype)} with {op.name}")
    wide = scratch("native.acc", src.size, acc)
    wide[...] = src
    t.allreduce(wide, op)
    dst[...] = wide
