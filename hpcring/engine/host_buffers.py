"""Zero-copy batches: finding callers' tensors that lie back to back in memory (gradient buckets), and
unpacking a reduced fusion buffer into outputs with C-level passes."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from hpcring.collective.ops import ReduceOp
from hpcring.engine.request import Signature
from hpcring.engine.request import drain as _drain

NDArray = np.ndarray[Any, Any]


_C_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")

_NBYTES = operator.attrgetter("nbytes")

_ARRAY_SHAPE = operator.attrgetter("shape")

_NDIM = operator.attrgetter("ndim")

_ADDRESS = operator.attrgetter("address")

_READONLY = operator.attrgetter("readonly")

_DTYPE = operator.attrgetter("dtype")

_is_none = functools.partial(operator.is_, None)


def _adjacent_span(
    arrays: Sequence[NDArray], buffer: Callable[[NDArray], Any], writeable: bool = False
) -> tuple[int, NDArray] | None:
    """(start address, one flat array over all of them) when `arrays` (at least two) are C-contiguous, of one
    dtype and lie back to back in memory in list order (and are writeable, if asked); else None.

    `buffer` exposes an array's memory as an object with `address`, `nbytes` and `readonly`, raising
    BufferError for a non-contiguous one: `mpi4py.MPI.buffer`, a C-level constructor much cheaper per array
    than numpy's `.ctypes.data` (docs/dev/engine.md, "Fusion"). List order matters: every rank presents the
    batch to the collective in the (agreed) order of its responses, whether from a span or packed. The first
    two arrays are checked before anything else, so independently allocated tensors (never adjacent: the
    allocator keeps a header between blocks) fail the check cheaply. The span covers exactly the bytes of the
    arrays, all alive for the duration of the operation, so reading and writing it is reading and writing
    them."""
    try:
        one, two = buffer(arrays[0]), buffer(arrays[1])
        if one.address + one.nbytes != two.address:
            return None
        bufs = list(map(buffer, arrays))
    except BufferError:  # not contiguous
        return None
    addrs = list(map(_ADDRESS, bufs))
    if list(map(operator.add, addrs[:-1], map(_NBYTES, bufs))) != addrs[1:]:
        return None
    first, n = arrays[0], len(arrays)
    if writeable and any(map(_READONLY, bufs)):
        return None
    if list(map(_DTYPE, arrays)).count(first.dtype) != n:
        return None
    if list(map(_NDIM, arrays)).count(1) != n and not all(map(_C_CONTIGUOUS, arrays)):
        return None  # contiguous in Fortran order only: memory order is not the flattening order
    count = (addrs[-1] + bufs[-1].nbytes - addrs[0]) // first.itemsize
    span = np.lib.stride_tricks.as_strided(first.reshape(-1), shape=(count,), strides=(first.itemsize,))
    return addrs[0], span


def _postscale(sig: Signature, op: ReduceOp, size: int) -> float:
    """The factor applied after the sum: AVERAGE folds 1/size into the postscale (one rounding)."""
    return sig.postscale / size if op is ReduceOp.AVERAGE else sig.postscale


def _unpack(buf: NDArray, counts: list[int], outputs: list[NDArray]) -> None:
    """Copy consecutive pieces of `buf` (`counts` elements each) into `outputs`, as C-level passes.

    `out[...] = piece` is the cheapest numpy copy call; pieces are reshaped only when an output is not 1-D."""
    ends = list(itertools.accumulate(counts))
    pieces: Iterable[NDArray] = map(buf.__getitem__, map(slice, [0, *ends[:-1]], ends))
    if list(map(_NDIM, outputs)).count(1) != len(outputs):
        pieces = map(np.ndarray.reshape, pieces, map(_ARRAY_SHAPE, outputs))
    _drain(map(np.ndarray.__setitem__, outputs, repeat(Ellipsis), pieces))
