"""Reduction operators.

One enum serves every layer: the public API (`hpcring.Sum` style aliases come from `hpcring.torch`), the
algorithms (which reduce with numpy ufuncs in place) and the backends (which map it to their native op).
AVERAGE is not a reduction of its own anywhere: it is SUM followed by a scale of 1/size, which is also how
Horovod defines it, so every backend only has to know SUM, MIN, MAX and PRODUCT.
"""

from __future__ import annotations

import enum
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
    """
    base = op.base
    if base is ReduceOp.SUM:
        return np.logical_or if dtype == np.bool_ else np.add
    if base is ReduceOp.PRODUCT:
        return np.logical_and if dtype == np.bool_ else np.multiply
    if base is ReduceOp.MIN:
        return np.minimum
    return np.maximum
