"""What the Adasum tests share: each rank's vectors (from the rank alone) and the expected result for the
route this launch takes, from the NumPy reference (`adasum_reference.py`)."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
from adasum_reference import adasum, hierarchical

NDArray = np.ndarray[Any, Any]
SIZES = (5, 17, 1, 64, 300)  # several tensors, odd lengths: the halves cut through them


def vectors(rank: int, dtype: Any, sizes: tuple[int, ...] = SIZES, seed: int = 0) -> list[NDArray]:
    g = np.random.default_rng(1000 * seed + rank)
    return [g.standard_normal(s).astype(dtype) for s in sizes]


def node_aware() -> bool:
    """The launch's CPU tensors take the process-group route (gloo standing in for NCCL): Horovod's GPU
    form, a sum inside each node and Adasum across nodes."""
    return os.environ.get("HPCRING_CPU_DEVICE_PLANE", "off") == "gloo"


def expected(hvd: ModuleType, per_rank: list[list[NDArray]]) -> list[NDArray]:
    if node_aware():
        return hierarchical(per_rank, hvd.local_size())
    return adasum(per_rank)


def tolerance(dtype: Any) -> dict[str, float]:
    """Only the order of the partial dot products differs from the reference (float16 also sums inside
    the node in its own dtype on the node-aware route)."""
    if np.dtype(dtype) == np.float16:
        return {"rtol": 4e-3, "atol": 2e-3}
    if np.dtype(dtype) == np.float32:
        return {"rtol": 2e-6, "atol": 1e-7}
    return {"rtol": 1e-12, "atol": 1e-14}
