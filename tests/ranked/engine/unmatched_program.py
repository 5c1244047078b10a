"""A job where ranks do not submit the same collectives, for tests/engine/test_engine_unmatched.py.

Every rank first allreduces `step` once (so it is cached), then, by mode:
- `absent`: the last rank never submits again (stuck in its own Python code, as in a data loader); the others
  allreduce `step` again;
- `names`: even ranks allreduce `even`, odd ranks allreduce `odd`;
- `ops`: even ranks allreduce `grad`, odd ranks allgather `grad`;
- `exit0`: the last rank ends with `os._exit(0)`; the others allreduce `step` again.
Prints `READY rank r` once the first allreduce is done, and `SURVIVED rank r` if a collective ever returns.
"""

from __future__ import annotations

import os
import sys
import threading

import torch

import hpcring.torch as hvd


def main() -> None:
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(torch.ones(2), name="step")
    print(f"READY rank {r}", flush=True)
    if mode in ("absent", "exit0") and r == n - 1:
        if mode == "exit0":
            os._exit(0)
        _deadlock()
    if mode == "names":
        hvd.allreduce(torch.ones(2), name="even" if r % 2 == 0 else "odd")
    elif mode == "ops" and r % 2:
        hvd.allgather(torch.ones(2), name="grad")
    elif mode == "ops":
        hvd.allreduce(torch.ones(2), name="grad")
    else:
        hvd.allreduce(torch.ones(2), name="step")
    print(f"SURVIVED rank {r}", flush=True)


def _deadlock() -> None:
    """A Python deadlock: a lock taken twice by the thread that holds it."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


if __name__ == "__main__":
    main()
