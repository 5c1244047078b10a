"""The dtype table: what each collective accepts, and how 16-bit floats are moved and reduced.

MPI has no float16 or bfloat16 reductions. Data movement (allgather, broadcast, alltoall, the sends of our
ring) does not care about the meaning of the bits, so every dtype travels as an unsigned integer of the same
width (`wire_view`). Reductions need arithmetic: our ring reduces in numpy in the dtype itself (ml_dtypes
provides bfloat16 arithmetic), and the native path accumulates float16/bfloat16 in float32 and rounds once.
Either way no precision is lost beyond the dtype's own rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcring.collective.ops import ReduceOp
from hpcring.errors import ConfigError, choices

# Names as numpy spells them (`np.dtype(...).name`); bfloat16 is ml_dtypes' numpy dtype.
SUPPORTED: tuple[str, ...] = (
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "bool",
)
HALF = frozenset({"float16", "bfloat16"})
FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
INTEGERS = frozenset({"uint8", "int8", "int16", "int32", "int64"})

# Reductions that mean something per dtype. On bool, MIN and MAX are logical AND and OR; a bool SUM, AVERAGE
# or PRODUCT has no single obvious meaning, so it is refused rather than guessed.
_BOOL_OPS = frozenset({ReduceOp.MIN, ReduceOp.MAX})

_WIRE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


_NAMES: dict[np.dtype[Any], str] = {}


def name_of(dtype: np.dtype[Any]) -> str:
    """Canonical name of a numpy dtype (`bool` for numpy's `bool_`); cached: `dtype.name` costs
    microseconds."""
    name = _NAMES.get(dtype)
    if name is None:
        name = "bool" if dtype == np.bool_ else dtype.name
        _NAMES[dtype] = name
    return name


def check_dtype(dtype: np.dtype[Any], what: str) -> str:
    """Return the dtype's name, or raise ConfigError listing the supported dtypes."""
    name = name_of(dtype)
    if name not in SUPPORTED:
        raise ConfigError(f"{what}: unsupported dtype {name!r}; supported: {choices(SUPPORTED)}")
    return name


def check_op(name: str, op: ReduceOp, what: str) -> None:
    """Refuse reductions that are undefined for the dtype (only bool has such limits)."""
    if name == "bool" and op not in _BOOL_OPS:
        raise ConfigError(
            f"{what}: op {op.name} is not defined for bool tensors; allowed for bool: MIN (logical and) or "
            "MAX (logical or)"
        )


def wire_view(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Same memory, viewed as unsigned integers of the same width: how any dtype is moved without
    arithmetic."""
    flat = arr.reshape(-1)
    return flat.view(_WIRE[arr.dtype.itemsize])


def accumulator(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """Dtype in which a native (MPI) reduction runs: float32 for the 16-bit floats MPI cannot add."""
    if name_of(dtype) in HALF:
        return np.dtype(np.float32)
    return dtype


def scale(buf: np.ndarray[Any, Any], factor: float) -> None:
    """Multiply `buf` by `factor` in place, with one rounding per element.

    16-bit floats are scaled in float32 (a float16 factor such as 1/3 would add its own rounding error);
    integer buffers are scaled in float64 and truncated toward zero, as Horovod does, so AVERAGE of ints is
    `trunc(sum/n)`.
    """
    if factor == 1.0 or buf.size == 0:
        return
    flat = buf.reshape(-1)
    name = name_of(buf.dtype)
    if name in ("float32", "float64"):
        np.multiply(flat, factor, out=flat)
    elif name in HALF:
        flat[...] = (flat.astype(np.float32) * np.float32(factor)).astype(buf.dtype)
    elif name in INTEGERS:
        flat[...] = np.trunc(flat.astype(np.float64) * factor).astype(buf.dtype)
    else:
        raise ConfigError(f"cannot scale a {name} buffer; scale factors apply to numeric dtypes only")


def average(buf: np.ndarray[Any, Any], n: int, postscale: float = 1.0) -> None:
    """Turn a SUM into an AVERAGE over `n` ranks in place, then apply `postscale`.

    Floats scale once by postscale/n (one rounding, as Horovod folds the two factors). Integers are divided
    exactly, `trunc(sum / n)` (a float64 division is correctly rounded, so unlike multiplying by 1/n it never
    lands just below an integer), and only then scaled.
    """
    name = name_of(buf.dtype)
    if name in INTEGERS:
        if n != 1 and buf.size:
            flat = buf.reshape(-1)
            flat[...] = np.trunc(flat.astype(np.float64) / n).astype(buf.dtype)
        scale(buf, postscale)
    else:
        scale(buf, postscale / n)
