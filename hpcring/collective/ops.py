"""Reduction operators.

One enum serves every layer: the public API (`hpcring.Sum` style aliases come from `hpcring.torch`), the
algorithms (which reduce with numpy ufuncs in place) and the backends (which map it to their native op).
AVERAGE is not a reduction of its own anywhere: it is SUM followed by a scale of 1/size, which is also how
Horovod defines it, so every backend only has to know SUM, MIN, MAX and PRODUCT.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcring.errors import ConfigError, choices


class ReduceOp(enum.Enum):
    """How values from different ranks combine."""

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    @property
    def base(self) -> ReduceOp:
        """The operator the wire actually reduces with: AVERAGE travels as SUM and is scaled afterwards."""
        return ReduceOp.SUM if self is ReduceOp.AVERAGE else self


# By the agreed name (a signature's `reduce_op`): a dict lookup; Enum's by-value lookup runs Python code.
BY_VALUE: dict[str, ReduceOp] = {op.value: op for op in ReduceOp}

_ALIASES = {"avg": ReduceOp.AVERAGE, "mean": ReduceOp.AVERAGE, "prod": ReduceOp.PRODUCT}


def parse_op(op: object) -> ReduceOp:
    """Accept a ReduceOp or its name (any case, e.g. "sum", "Average"); anything else is a ConfigError."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        key = op.strip().lower()
        for member in ReduceOp:
            if member.value == key or member.name.lower() == key:
                return member
        if key in _ALIASES:
            return _ALIASES[key]
    raise ConfigError(f"unknown reduce op {op!r}; allowed: {choices(m.name for m in ReduceOp)}")


Ufunc = Callable[..., Any]


def ufunc(op: ReduceOp, dtype: np.dtype[Any]) -> Ufunc:
    """The numpy ufunc that combines two buffers for `op` (used with `out=` so reductions never allocate).

    For bool, MIN and MAX are logical AND and OR, which is what np.minimum / np.maximum compute on bools.
    float16 and bfloat16 go through torch's kernels when torch is already loaded (a torch program): numpy's
    float16 arithmetic is scalar and far slower (docs/guide/collectives.md, "dtypes and ops"), and both
    compute each element in float32 and round once, so the results are the same bits.
    """
    base = op.base
    if dtype.name in _HALF_TORCH and "torch" in sys.modules:
        return functools.partial(_torch_combine, _TORCH_FN[base], dtype.name)
    if base is ReduceOp.SUM:
        return np.logical_or if dtype == np.bool_ else np.add
    if base is ReduceOp.PRODUCT:
        return np.logical_and if dtype == np.bool_ else np.multiply
    if base is ReduceOp.MIN:
        return np.minimum
    return np.maximum


_HALF_TORCH = ("float16", "bfloat16")
_TORCH_FN = {
    ReduceOp.SUM: "add",
    ReduceOp.PRODUCT: "mul",
    ReduceOp.MIN: "minimum",
    ReduceOp.MAX: "maximum",
}


def _torch_combine(fn: str, dtype: str, a: Any, b: Any, out: Any) -> None:
    """out = fn(a, b) for 16-bit float numpy arrays (1-D, contiguous), computed by torch on their memory."""
    torch = sys.modules["torch"]
    tdt = torch.float16 if dtype == "float16" else torch.bfloat16
    ta, tb, to = (torch.from_numpy(x.view(np.int16)).view(tdt) for x in (a, b, out))
    getattr(torch, fn)(ta, tb, out=to)
