"""Keep a training process's freed memory in its heap instead of returning it to the kernel every step.

Why: glibc's malloc raises its mmap threshold dynamically and trims the heap top whenever more than the trim
threshold is free there. A CPU training step allocates and frees tens of MiB of activations and gradients, so
under that policy part of them goes back to the kernel every step and returns as minor page faults in the
next; which part depends on the heap's layout, so it differs between models of one process. With a fixed
mmap threshold (glibc's own dynamic ceiling) and a trim threshold of 256 MiB, those faults are gone; the cost
is at most that much free heap top kept mapped per arena (docs/dev/engine.md, "The heap").

`init()` of `hpcring.torch` applies it once per process, unless `HPCRING_HEAP_TUNING=0`, the user chose
the allocator's settings (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`,
`MALLOC_MMAP_MAX_`, or `glibc.malloc.*` in `GLIBC_TUNABLES`), another allocator is preloaded (jemalloc,
tcmalloc, mimalloc: they have their own policies), or the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Mapping

from hpcring.config import parse_bool

MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the most it would grow to itself
TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3

_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_lock = threading.Lock()
_state: str | None = None  # what tune() did in this process, once it ran


def reason_to_skip(env: Mapping[str, str]) -> str | None:
    """Why the heap must be left as it is (None: tune it). A bad HPCRING_HEAP_TUNING is a ConfigError."""
    text = env.get("HPCRING_HEAP_TUNING")
    if text is not None and not parse_bool("HPCRING_HEAP_TUNING", text.strip()):
        return f"HPCRING_HEAP_TUNING={text}"
    user = [v for v in _USER_VARS if v in env]
    user += [t for t in _TUNABLES if t in env.get("GLIBC_TUNABLES", "")]
    if user:
        return f"the allocator is configured by the user ({', '.join(user)})"
    preload = env.get("LD_PRELOAD", "")
    other = [a for a in _OTHER_ALLOCATORS if a in preload]
    if other:
        return f"{other[0]} is preloaded (LD_PRELOAD)"
    libc, _ = platform.libc_ver()
    if libc != "glibc":
        return f"the C library is {libc or 'not glibc'}"
    return None


def tune(env: Mapping[str, str] | None = None) -> str:
    """Fix glibc's mmap and trim thresholds for this process (once); return what was done, for the log."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        skip = reason_to_skip(os.environ if env is None else env)
        if skip is not None:
            _state = f"left as it is: {skip}"
            return _state
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        _state = (
            f"tuned: mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB"
            if ok
            else "left as it is: mallopt refused the thresholds"
        )
        return _state


def state() -> str | None:
    """What `tune()` did in this process (None: it has not run)."""
    return _state
