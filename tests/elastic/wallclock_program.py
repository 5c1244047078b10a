"""A plain training loop (no hvd.elastic) that reacts to the wall-clock warning through
`hpcring.torch.on_wall_clock`, for tests/elastic/test_requeue.py: the hook sets a flag, the loop agrees on it
at the end of each step and every rank leaves with REQUEUE_EXIT_CODE (where a real script would save first).
"""

from __future__ import annotations

import os
import sys
import time

import torch

import hpcring.torch as hvd

hvd.init()
warned: list[str] = []
hvd.on_wall_clock(warned.append)
print("READY", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)  # a training step
    flag = torch.tensor([1 if warned else 0])
    if int(hvd.allreduce(flag, op=hvd.Max, name="warned")[0]):
        until = time.monotonic() + 10
        while not warned and time.monotonic() < until:  # the launcher warns every rank, a moment apart
            time.sleep(0.01)
        print(f"WARNED {warned[0] if warned else '-'} rank={hvd.rank()}", flush=True)
        hvd.barrier()
        sys.stdout.flush()
        os._exit(hvd.REQUEUE_EXIT_CODE)
sys.exit(1)  # the warning never came
