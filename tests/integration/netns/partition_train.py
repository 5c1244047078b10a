"""Training that a fault interrupts, for test_partition.py: `python partition_train.py MARKER [SECONDS]`.

A DistributedOptimizer loop of small steps (a 16 -> 1 linear model, 0.05 s apart) that would run for SECONDS
(default 240). Each rank first prints `READY rank host pid` and `SHM rank PATHS` (the shared-memory files it
maps, comma-separated), then `STEP n` lines, so the test knows where
every rank runs and when training is under way. MARKER is only there to be found in the processes' argv.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch

import hpcring.torch as hvd

hvd.init()
print(f"READY {hvd.rank()} {socket.gethostname()} {os.getpid()}", flush=True)
with open("/proc/self/maps") as maps:
    shm = sorted({line.split()[5] for line in maps if len(line.split()) == 6 and "/dev/shm/" in line})
print(f"SHM {hvd.rank()} {','.join(shm)}", flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.full((8, 16), float(hvd.rank() + 1))
end = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 240)
step = 0
while time.monotonic() < end:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    step += 1
    print(f"STEP {step}", flush=True)
    time.sleep(0.05)
print(f"END {step}", flush=True)
