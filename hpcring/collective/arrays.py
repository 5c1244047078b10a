"""Numpy arrays and CPU torch tensors in, the same kind out, without copying the data.

A torch tensor is looked at through `Tensor.numpy()` (shared memory, so writes through the view land in the
tensor); bfloat16, which numpy lacks, is viewed as int16 and reinterpreted as ml_dtypes' bfloat16. torch is
never imported here: a tensor can only exist if the caller already imported torch, so `sys.modules` is enough.
Non-contiguous inputs are copied into a contiguous buffer and, for in-place operations, copied back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcring._deps import require
from hpcring.errors import ConfigError

NDArray = np.ndarray[Any, Any]


@dataclass
class Buffer:
    """A contiguous numpy view of a user's array or tensor, and how to hand a result back in the same kind."""

    array: NDArray  # C-contiguous, shares memory with `original` unless `copied`
    original: Any
    is_torch: bool
    copied: bool

    def writeback(self) -> None:
        """Copy the contiguous buffer back into a non-contiguous original (no-op when they share memory)."""
        if not self.copied:
            return
        if self.is_torch:
            self.original.copy_(to_kind(self.array, torch_like=True))
        else:
            self.original[...] = self.array

    def wrap(self, result: NDArray) -> Any:
        """Return `result` as the caller's kind (a tensor for a tensor input, else the numpy array)."""
        return to_kind(result, torch_like=self.is_torch)


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)  # None also for a namespace package shadowing a missing torch


def is_tensor(x: object) -> bool:
    """True for a torch tensor (without importing torch)."""
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


def bfloat16() -> np.dtype[Any]:
    """ml_dtypes' bfloat16 numpy dtype (BackendUnavailable naming the install command if missing)."""
    dtype: np.dtype[Any] = np.dtype(require("ml_dtypes").bfloat16)
    return dtype


def numpy_view(t: Any) -> NDArray:
    """numpy view of a contiguous CPU tensor's memory, no copy (bfloat16 as ml_dtypes' bfloat16)."""
    torch = sys.modules["torch"]
    if t.dtype is torch.bfloat16:  # dtypes are singletons: identity, not the slower __eq__ (once per tensor)
        arr: NDArray = t.view(torch.int16).numpy().view(bfloat16())
        return arr
    view: NDArray = t.numpy()
    return view


def _tensor_view(t: Any, what: str) -> tuple[NDArray, bool]:
    if t.device.type != "cpu":
        raise ConfigError(
            f"{what}: tensor is on {t.device}; hpcring.collective takes CPU tensors only (GPU tensors "
            "go through hpcring.torch with the NCCL backend)"
        )
    t = t.detach()
    copied = not t.is_contiguous()
    if copied:
        t = t.contiguous()
    try:
        return numpy_view(t), copied
    except TypeError as exc:  # complex32, quantized, ... numpy cannot hold them
        raise ConfigError(f"{what}: unsupported tensor dtype {t.dtype}") from exc


def as_buffer(x: object, what: str) -> Buffer:
    """Contiguous numpy view of `x`; ConfigError naming the accepted kinds for anything else."""
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous:
            return Buffer(x, x, False, False)
        return Buffer(np.ascontiguousarray(x), x, False, True)
    if is_tensor(x):
        arr, copied = _tensor_view(x, what)
        return Buffer(arr, x, True, copied)
    raise ConfigError(
        f"{what}: expected a numpy.ndarray or a CPU torch.Tensor, "
        f"got {type(x).__module__}.{type(x).__qualname__}"
    )


def to_kind(arr: NDArray, *, torch_like: bool) -> Any:
    """Hand `arr` out as a torch tensor sharing its memory, or as is."""
    if not torch_like:
        return arr
    torch = sys.modules["torch"]
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def empty_like_kind(shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray:
    """A new C-contiguous numpy buffer for a result (wrapped into a tensor afterwards when needed)."""
    return np.empty(shape, dtype=dtype)
