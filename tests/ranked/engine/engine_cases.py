"""Helpers shared by the engine tests that run inside every rank."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcring.engine import Engine, Handle, OpType, Request, Signature, signature_shape


def submit(
    engine: Engine,
    op: OpType,
    name: str,
    x: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
    reduce_op: str = "sum",
    root: int = -1,
    set_id: int = 0,
    **extra: Any,
) -> Handle:
    """Queue one request the way a framework adapter does."""
    sig = Signature(
        name,
        op,
        dtype="" if x is None else x.dtype.name,
        shape=() if x is None else signature_shape(op, x.shape),
        reduce_op=reduce_op if op in (OpType.ALLREDUCE, OpType.REDUCESCATTER) else "",
        root=root,
        **extra,
    )
    if op is OpType.ALLREDUCE and out is None and x is not None:
        out = np.empty_like(x)
    return engine.submit(Request(sig, set_id, x, out))
