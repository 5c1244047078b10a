"""A Horovod-shaped elastic script with a bug before its first commit: every rank raises the same
AttributeError. `hpcring run` must end the job at once with that error, not blacklist host after host."""

from __future__ import annotations

import time

import torch

import hpcring.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())


def load_batch(step: int) -> torch.Tensor:
    return torch.full((2, 4), float(step)).nromalize()  # the bug: a misspelt method, on every rank


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.step < 10:
        optimizer.zero_grad()
        print(f"FAILING rank={hvd.rank()} t={time.time():.3f}", flush=True)
        model(load_batch(state.step)).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()


train(hvd.elastic.TorchState(model, optimizer, step=0))
