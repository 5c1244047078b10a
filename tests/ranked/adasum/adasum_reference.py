"""A NumPy Adasum: the same tree as Horovod's (and hpcring's), computed whole on every rank.

At each level, blocks of 2^k ranks combine with the neighbouring block, the lower one on the left, tensor by
tensor: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, a coefficient left at 1 where the squared norm is below
sqrt(DBL_MIN). Dot products and norms are float64 over the whole tensor; the combination is float64 (float32
for float16, coefficients rounded to float32) and rounded to the dtype after each level, as the distributed
version stores each level's result. Only the order in which the partial dot products are added differs from
the distributed version, so results agree to a few units in the last place.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

NDArray = np.ndarray[Any, Any]
TINY = math.sqrt(sys.float_info.min)


def combine(a: NDArray, b: NDArray) -> NDArray:
    """The Adasum of two tensors of one dtype, rounded to it."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, aa, bb = float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)
    ca = 1.0 - dot / aa * 0.5 if aa >= TINY else 1.0
    cb = 1.0 - dot / bb * 0.5 if bb >= TINY else 1.0
    if a.dtype == np.float16:
        wide = np.float32
        out = a.astype(wide) * wide(ca) + b.astype(wide) * wide(cb)
    else:
        out = a.astype(np.float64) * ca + b.astype(np.float64) * cb
    return out.astype(a.dtype)


def adasum(per_rank: list[list[NDArray]]) -> list[NDArray]:
    """Adasum over ranks (a power of two of them) of several tensors each: per_rank[r][i] is rank r's
    tensor i; returns each tensor's result."""
    level = [list(ts) for ts in per_rank]
    while len(level) > 1:
        level = [
            [combine(x, y) for x, y in zip(level[i], level[i + 1], strict=True)]
            for i in range(0, len(level), 2)
        ]
    return level[0]


def hierarchical(per_rank: list[list[NDArray]], local_size: int) -> list[NDArray]:
    """Horovod's GPU Adasum: each node's sum (ranks are numbered node by node, rounded once to the dtype),
    Adasum over the nodes, divided by the node's rank count."""
    dtype = per_rank[0][0].dtype
    nodes = []
    for first in range(0, len(per_rank), local_size):
        members = per_rank[first : first + local_size]
        nodes.append(
            [
                np.sum([m[i].astype(np.float64) for m in members], axis=0).astype(dtype)
                for i in range(len(members[0]))
            ]
        )
    return [(t.astype(np.float64) / local_size).astype(dtype) for t in adasum(nodes)]
