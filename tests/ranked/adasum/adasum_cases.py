"""What the Adasum tests share: each rank's vectors (from the rank alone) and the expected result for the
route this launch takes, from the NumPy reference (`adasum_reference.py`)."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
import torch
from adasum_reference import adasum, hierarchical

NDArray = np.ndarray[Any, Any]
SIZES = (5, 17, 1, 64, 300)  # several tensors, odd lengths: the halves cut through them


def vectors(rank: int, dtype: Any, sizes: tuple[int, ...] = SIZES, seed: int = 0) -> list[NDArray]:
    g = np.random.default_rng(1000 * seed + rank)
    return [g.standard_normal(s).astype(dtype) for s in sizes]


# CI runs CPU tensors; benchmarks/gpu_check.sh sets HPCRING_TEST_DEVICE=cuda for CUDA tensors on
# cuda:LOCAL_RANK (cuda:RANK on emulated nodes), as the device-plane suite does.
CUDA = os.environ.get("HPCRING_TEST_DEVICE", "cpu") == "cuda"


def _device() -> torch.device:
    if not CUDA:
        return torch.device("cpu")
    key = "RANK" if os.environ.get("HPCRING_EMULATE_NODES") else "LOCAL_RANK"
    return torch.device("cuda", int(os.environ.get(key, "0")) % torch.cuda.device_count())


DEVICE = _device()


def dev(v: NDArray) -> torch.Tensor:
    """A rank's vector as a tensor on the device under test."""
    return torch.from_numpy(np.ascontiguousarray(v)).to(DEVICE)


def host(t: torch.Tensor) -> NDArray:
    out: NDArray = t.detach().cpu().numpy()
    return out


def node_aware() -> bool:
    """This launch's tensors take a process-group route (NCCL, or gloo standing in for it with CPU
    tensors): Horovod's GPU form, a sum inside each node and Adasum across nodes."""
    if CUDA:
        ops = os.environ.get("HPCRING_GPU_OPERATIONS") or os.environ.get("HOROVOD_GPU_OPERATIONS") or "nccl"
        return ops.lower() == "nccl"
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
