"""What a negotiation cycle produces, and how it is planned into batches.

A `Response` is one agreed operation, identical on every rank of the set (except the local request); the
fusion plan groups compatible allreduces into batches up to the fusion threshold, deterministically, so
every rank forms the same batches. The C-level getters here are what the hot path maps over a cycle's
requests and responses instead of per-tensor Python loops."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from hpcring.engine.request import OpType, Request, Signature


@functools.lru_cache(maxsize=64)
def numpy_dtype(name: str) -> np.dtype[Any]:
    """numpy dtype from the agreed dtype name (bfloat16 comes from ml_dtypes)."""
    if name == "bfloat16":
        from hpcring.collective.arrays import bfloat16

        return bfloat16()
    return np.dtype(name)


class Response(NamedTuple):
    """One agreed operation of a cycle, identical on every rank of the set (except `local`).

    A NamedTuple: a steady-state cycle builds one per cached tensor, in C (`_response`) from zipped columns.
    """

    sig: Signature
    local: Request | None  # this rank's request; None when this rank joined and contributes neutral values
    error: str | None = None
    result: Any = None  # join: last joined rank
    ready_at: float = 0.0  # when negotiation found it ready (timeline)
    bit: int = -1  # response-cache position it was taken from; -1 when it came through the table


_Plan = list[list[int]]  # batches as positions in a cycle's responses (`plan_indices`)

# Response from a (sig, local, error, result, ready_at, bit) tuple without a Python-level __new__.
_response = functools.partial(tuple.__new__, Response)


def plan_batches(responses: list[Response], limit: int) -> list[list[Response]]:
    """Group responses into batches run one after the other: compatible allreduces (same dtype, op, scale
    factors, device) fused up to `limit` bytes, looking ahead over allreduces only (never past another op, so
    e.g. a barrier keeps its place). Deterministic, so every rank forms the same batches."""
    return [list(map(responses.__getitem__, idx)) for idx in plan_indices(responses, limit)]


def plan_indices(responses: Sequence[Response], limit: int) -> list[list[int]]:
    """`plan_batches` as positions in `responses` (what the engine remembers between cycles)."""
    n = len(responses)
    if limit <= 0 or n == 1:
        return [[i] for i in range(n)]
    sigs = list(map(_SIG, responses))
    keys = list(map(_FUSION_KEY, sigs))
    if (  # the steady state, one group of like allreduces: decided with C-level passes over the lists
        keys.count(keys[0]) == n
        and list(map(_OP_TYPE, sigs)).count(_ALLREDUCE) == n
        and list(map(_ERROR, responses)).count(None) == n
        and _itemsize(sigs[0].dtype) * sum(map(math.prod, map(_SHAPE, sigs))) <= limit
    ):
        return [list(range(n))]
    # Per response, computed once: its fusion key (None when it never fuses) and size; a look-ahead stops at
    # the first response that is not an allreduce.
    allreduce = [s.op_type is _ALLREDUCE for s in sigs]
    fusable = [
        k if ar and r.error is None else None for r, k, ar in zip(responses, keys, allreduce, strict=True)
    ]
    sizes = [_nbytes(r.sig) if k is not None else 0 for r, k in zip(responses, fusable, strict=True)]
    batches: list[list[int]] = []
    used = [False] * n
    for i in range(n):
        if used[i]:
            continue
        used[i] = True
        batch = [i]
        key = fusable[i]
        if key is not None:
            total = sizes[i]
            for j in range(i + 1, n):
                if not allreduce[j]:
                    break
                if used[j] or fusable[j] != key or total + sizes[j] > limit:
                    continue
                used[j] = True
                batch.append(j)
                total += sizes[j]
        batches.append(batch)
    return batches


# Signature fields read in bulk with C-level getters (NamedTuple positions): what must match to fuse
# (dtype, reduce op, prescale, postscale, device), the op type and the shape.
_FUSION_KEY = operator.itemgetter(
    *(Signature._fields.index(f) for f in ("dtype", "reduce_op", "prescale", "postscale", "device"))
)

_OP_TYPE = operator.itemgetter(Signature._fields.index("op_type"))

_SHAPE = operator.itemgetter(Signature._fields.index("shape"))


def _nbytes(sig: Signature) -> int:
    return sig.numel * _itemsize(sig.dtype)


def _itemsize(dtype: str) -> int:
    size = _itemsizes.get(dtype)
    if size is None:
        size = _itemsizes[dtype] = numpy_dtype(dtype).itemsize
    return size


_itemsizes: dict[str, int] = {}  # by agreed dtype name (a dict lookup is cheaper than the lru_cache call)

# Hot-path getters: C-level callables for map() over a cycle's requests and responses.
_REQ_SIG = operator.attrgetter("sig")

_SIG_NAME = operator.attrgetter("sig.name")  # requests and responses both carry .sig

_REQ_SET = operator.attrgetter("process_set_id")

_TENSOR = operator.attrgetter("tensor")

_OUTPUT = operator.attrgetter("output")

_HANDLE = operator.attrgetter("handle")

_SIG, _LOCAL, _ERROR, _BIT = (
    operator.itemgetter(Response._fields.index(f)) for f in ("sig", "local", "error", "bit")
)

# Enum members read once: attribute access on an Enum class runs Python code (its cost:
# docs/dev/bench-engine.md).
_ALLREDUCE = OpType.ALLREDUCE

_JOIN = OpType.JOIN
