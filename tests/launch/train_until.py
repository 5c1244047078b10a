"""A real training job for launcher tests: `python train_until.py DIR`.

Each rank trains a small linear model with DistributedOptimizer on its own data until the file DIR/stop
appears (rank 0 looks, and broadcasts the decision, so every rank stops after the same step). Every rank
prints `ready` after its first step and, at the end, `rank R of S: STEPS steps, replicas agree, sum S'`,
where the agreement is checked by allreducing the weights' spread and the sum is that of rank+1 over the
world: what the test expects is computed from rank and size alone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import hpcring.torch as hvd


def main() -> None:
    stop = Path(sys.argv[1], "stop")
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())
    model = torch.nn.Linear(16, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    steps = 0
    while True:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
        if steps == 1:
            print("ready", flush=True)
        done = torch.tensor([1 if hvd.rank() == 0 and stop.exists() else 0])
        if int(hvd.broadcast(done, root_rank=0, name="stop")) == 1:
            break
        time.sleep(0.05)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = hvd.allreduce(flat, op=hvd.Max, name="max") - hvd.allreduce(flat, op=hvd.Min, name="min")
    agree = "agree" if float(spread.abs().max()) == 0.0 else "differ"
    total = int(hvd.allreduce(torch.tensor(hvd.rank() + 1), op=hvd.Sum, name="sum"))
    print(f"rank {hvd.rank()} of {hvd.size()}: {steps} steps, replicas {agree}, sum {total}", flush=True)


if __name__ == "__main__":
    main()
