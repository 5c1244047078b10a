"""Reusable scratch buffers, one set per thread.

A fresh 16 MiB `np.empty` costs page faults on first touch every call; keeping the scratch alive between calls
makes the second call of a size as cheap as the hundredth. Per thread, because the engine runs collectives on
its own background thread while a user may call the direct API on the main one.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

_local = threading.local()


def scratch(slot: str, count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A buffer of `count` items of `dtype`, reused for the same `slot` (contents undefined)."""
    pool: dict[str, np.ndarray[Any, Any]] = getattr(_local, "pool", None) or {}
    _local.pool = pool
    nbytes = count * dtype.itemsize
    raw = pool.get(slot)
    if raw is None or raw.nbytes < nbytes:
        raw = np.empty(max(nbytes, 64), dtype=np.uint8)
        pool[slot] = raw
    return raw[:nbytes].view(dtype)


def release() -> None:
    """Drop this thread's scratch buffers (on shutdown)."""
    _local.pool = {}
