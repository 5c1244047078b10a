"""A Horovod elastic script, unchanged: `import horovod.torch as hvd`, `hvd.elastic.TorchState`,
`@hvd.elastic.run`, commits every step. Run by test_horovod_launch.py under `hpcring run --horovod --min-np`;
prints `horovod-elastic rank=R size=S steps=N wsum=W` when done (W: the weights' sum, equal on every rank)."""

from __future__ import annotations

import horovod.torch as hvd  # resolved to hpcring by --horovod
import torch

STEPS = 5

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> int:
    while state.step < STEPS:
        data = torch.full((2, 4), float(hvd.rank() + 1))
        optimizer.zero_grad()
        model(data).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()
    return int(state.step)


steps = train(state)
wsum = float(sum(p.detach().sum() for p in model.parameters()))
print(f"horovod-elastic rank={hvd.rank()} size={hvd.size()} steps={steps} wsum={wsum:.6f}", flush=True)
