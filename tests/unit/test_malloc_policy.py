"""hpcring/malloc_policy.py: glibc's thresholds are fixed so a training step's freed memory is reused, not
faulted in again; the user's own allocator choices are left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hpcring import malloc_policy
from hpcring.errors import ConfigError

# One "step": 16 blocks of 1 MiB allocated, touched and freed, after glibc has raised its dynamic mmap
# threshold to 1 MiB (a freed mmapped 1 MiB block). Under glibc's defaults the 16 MiB free at the heap
# top exceeds the dynamic trim threshold (2 MiB) and goes back to the kernel every step: ~4,000 faults
# per step. Tuned, the heap keeps it.
_STEPS = textwrap.dedent(
    """
    import ctypes, resource, sys
    import hpcring.malloc_policy as malloc_policy
    print(malloc_policy.tune())
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    MiB = 1 << 20
    p = libc.malloc(MiB); ctypes.memset(p, 1, MiB); libc.free(p)
    faults = []
    for _ in range(6):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ptrs = [libc.malloc(MiB) for _ in range(16)]
        for q in ptrs: ctypes.memset(q, 1, MiB)
        for q in reversed(ptrs): libc.free(q)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(*faults)
    """
)


def _steady_faults(env: dict[str, str]) -> tuple[str, list[int]]:
    res = subprocess.run(
        [sys.executable, "-c", _STEPS], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    state, faults = res.stdout.splitlines()
    return state, [int(f) for f in faults.split()][1:]  # the first step faults the heap in either way


def _glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="the thresholds are glibc's")
def test_tuned_heap_keeps_a_steps_memory() -> None:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "HPCRING_HEAP"))}
    base.pop("GLIBC_TUNABLES", None)
    state, tuned = _steady_faults(base)
    assert state.startswith("tuned: mmap threshold 32 MiB, trim threshold 256 MiB")
    assert max(tuned) < 64, tuned  # nothing returned to the kernel: a few pages of Python's own
    state, default = _steady_faults({**base, "HPCRING_HEAP_TUNING": "0"})
    assert state == "left as it is: HPCRING_HEAP_TUNING=0"
    assert min(default) > 3000, default  # 16 MiB = 4,096 pages faulted in again each step


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"HPCRING_HEAP_TUNING": "off"}, "HPCRING_HEAP_TUNING=off"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "configured by the user (MALLOC_TRIM_THRESHOLD_)"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1024"},
            "configured by the user (glibc.malloc.mmap_threshold)",
        ),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "jemalloc is preloaded"),
    ],
)
def test_user_choices_are_left_alone(env: dict[str, str], reason: str) -> None:
    skip = malloc_policy.reason_to_skip(env)
    assert skip is not None and reason in skip


def test_defaults_tune_and_bad_values_name_the_variable() -> None:
    expected = None if _glibc() else malloc_policy.reason_to_skip({})
    assert malloc_policy.reason_to_skip({"HPCRING_HEAP_TUNING": "1"}) == expected
    with pytest.raises(ConfigError, match="HPCRING_HEAP_TUNING='maybe' is not a boolean"):
        malloc_policy.reason_to_skip({"HPCRING_HEAP_TUNING": "maybe"})
