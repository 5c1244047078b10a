"""Shared helpers for the collective tests that run inside every rank.

Inputs are generated from (rank, index) and expectations are computed by reducing the inputs of *all* ranks
locally in numpy, so every rank can check the full result without trusting any other rank.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hpcring.collective import ReduceOp

NDArray = np.ndarray[Any, Any]

ALL_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")
NUMERIC = tuple(d for d in ALL_DTYPES if d != "bool")
ALGORITHMS = ("auto", "native", "ring", "hierarchical", "shm")


def np_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def gen(rank: int, count: int, name: str, op: ReduceOp = ReduceOp.SUM) -> NDArray:
    """Rank's input: small values whose reduction is exact in every dtype (int8 and bfloat16 included)."""
    i = np.arange(count)
    if name == "bool":
        base = (i + rank) % 3 != 0
        return base
    if op is ReduceOp.PRODUCT:
        vals = 1 + (i + rank) % 2  # products stay <= 2**size
    elif op in (ReduceOp.MIN, ReduceOp.MAX):
        vals = (i * 3 + rank * 5) % 7 - (3 if name != "uint8" else 0)
    else:
        vals = i % 5 + rank % 3
    return vals.astype(np_dtype(name))


def expected_reduce(size: int, count: int, name: str, op: ReduceOp) -> NDArray:
    """Reduction of every rank's `gen` input, computed locally in float64 (exact for these values)."""
    inputs = [gen(r, count, name, op).astype(np.float64) for r in range(size)]
    if name == "bool":
        stack = np.array([gen(r, count, name, op) for r in range(size)])
        return stack.all(axis=0) if op is ReduceOp.MIN else stack.any(axis=0)
    if op is ReduceOp.MIN:
        out = np.min(inputs, axis=0)
    elif op is ReduceOp.MAX:
        out = np.max(inputs, axis=0)
    elif op is ReduceOp.PRODUCT:
        out = np.prod(inputs, axis=0)
    else:
        out = np.sum(inputs, axis=0)
        if op is ReduceOp.AVERAGE:
            out = np.trunc(out / size) if name in ("uint8", "int8", "int16", "int32", "int64") else out / size
    return out.reshape(-1) if count else np.zeros(0)


def emulated_node_of(rank: int, size: int) -> int:
    """Node of `rank` as the tests expect it: HPCRING_EMULATE_NODES blocks, else one host."""
    k = int(os.environ.get("HPCRING_EMULATE_NODES") or 1)
    return rank * k // size
