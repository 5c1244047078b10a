"""Joined ranks: what they contribute (neutral values) and what they cannot stand in for."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcring.engine.request import OpType

NDArray = np.ndarray[Any, Any]


def _neutral(op: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> NDArray:
    """What a joined rank contributes: zeros for Sum/Average (Horovod), the identity for Min/Max/Product."""
    if dtype.name == "bfloat16" and op in ("min", "max", "product"):  # ml_dtypes: kind 'V', its own finfo
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        return np.full(shape, info.max if op == "min" else (info.min if op == "max" else 1), dtype=dtype)
    if op == "min":
        fill: Any = (
            True if dtype == np.bool_ else (np.finfo(dtype).max if dtype.kind == "f" else np.iinfo(dtype).max)
        )
    elif op == "max":
        fill = (
            False
            if dtype == np.bool_
            else (np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min)
        )
    elif op == "product":
        fill = 1
    else:
        return np.zeros(shape, dtype=dtype)
    return np.full(shape, fill, dtype=dtype)


# What joined ranks cannot stand in for, as in Horovod's controller ("<Op> is not supported with Join at this
# time"): every op but allreduce (neutral values) and barrier (a joined rank is already waiting), and the
# process-set changes, which need every rank's own call.
_NO_STAND_IN = frozenset(
    {
        OpType.ALLGATHER,
        OpType.BROADCAST,
        OpType.ALLTOALL,
        OpType.REDUCESCATTER,
        OpType.ADD_PROCESS_SET,
        OpType.REMOVE_PROCESS_SET,
        OpType.TUNE,
    }
)
