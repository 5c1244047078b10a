"""Functions the Ray tests run on the workers (importable by name there: the cluster's PYTHONPATH has this
folder). Results are computed from rank and size; the tests compare them with single-process runs."""

from __future__ import annotations

import os
from typing import Any

import torch

import hpcring.torch as hvd

FEATURES, OUTPUTS = 6, 2


def data(total: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined batch every run draws from (the same on every worker)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(total, FEATURES, generator=g)
    return x, x @ torch.randn(FEATURES, OUTPUTS, generator=g) + 0.1 * torch.randn(total, OUTPUTS, generator=g)


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 4), torch.nn.Tanh(), torch.nn.Linear(4, OUTPUTS))


def train(steps: int, per_rank: int, seed: int, distributed: bool = True) -> dict[str, Any]:
    """`steps` SGD steps on this rank's slice of the combined batch (all of it when not distributed)."""
    torch.set_num_threads(1)
    rank, size = (0, 1)
    if distributed:
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    net = model(seed)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    x, y = data(per_rank * size, seed)
    mine = slice(rank * per_rank, (rank + 1) * per_rank) if distributed else slice(None)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
        opt.step()
    return {
        "rank": rank,
        "size": size,
        "local_rank": hvd.local_rank() if distributed else 0,
        "env_rank": os.environ.get("HPCRING_RANK"),
        "weights": [p.detach().clone() for p in net.parameters()],
    }


def rank_sum(offset: float) -> tuple[int, int, float]:
    """(rank, size, sum over ranks of rank + offset) through an allreduce."""
    hvd.init()
    t = torch.tensor([hvd.rank() + offset], dtype=torch.float64)
    return hvd.rank(), hvd.size(), float(hvd.allreduce(t, op=hvd.Sum).item())


def horovod_rank_sum(offset: float) -> tuple[int, int, float, str]:
    """rank_sum written as a Horovod script does: `import horovod.torch` (the executor's horovod=True)."""
    import horovod.torch as horovod_hvd

    horovod_hvd.init()
    t = torch.tensor([horovod_hvd.rank() + offset], dtype=torch.float64)
    total = float(horovod_hvd.allreduce(t, op=horovod_hvd.Sum).item())
    return horovod_hvd.rank(), horovod_hvd.size(), total, horovod_hvd.allreduce.__module__


class Counter:
    """An executable class: built once per worker by start(executable_cls=...)."""

    def __init__(self, start: int) -> None:
        hvd.init()
        self.value = start + hvd.rank()

    def bump(self, by: int) -> int:
        self.value += by
        return self.value


def fail_on(rank: int) -> int:
    """Raises ValueError on `rank` while the others wait in a collective (they must not hang)."""
    hvd.init()
    if hvd.rank() == rank:
        raise ValueError(f"rank {rank} fails on purpose")
    hvd.allreduce(torch.ones(1), name="never-completes")
    return hvd.rank()


def step_data(step: int, size: int, per_rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined batch of one step of the elastic run: depends on the step and the world size."""
    return data(per_rank * size, seed * 1000 + step)


def elastic_train(
    steps: int, per_rank: int, seed: int, commit_every: int, kill_rank: int, kill_step: int, out: str
) -> dict[str, Any]:
    """Horovod-style elastic training; in the first world, `kill_rank` SIGKILLs its own actor (the Ray
    worker process holding it) right after step `kill_step`, writing the time to `out`/killed."""
    import signal
    import time

    torch.set_num_threads(1)
    hvd.init()
    generation = int(os.environ.get("HPCRING_ELASTIC_GENERATION", "0"))
    net = model(seed)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters()
    )
    state = hvd.elastic.TorchState(net, opt, step=0, sizes=[], first_step_at=0.0)

    @hvd.elastic.run
    def train(state: Any) -> dict[str, Any]:
        while state.step < steps:
            rank, size = hvd.rank(), hvd.size()
            x, y = step_data(state.step, size, per_rank, seed)
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x[mine]), y[mine]).backward()
            opt.step()
            state.step += 1
            state.sizes = [*state.sizes, size]
            if generation > 0 and not state.first_step_at:
                state.first_step_at = time.time()  # the first step completed after the failure
            if state.step % commit_every == 0:
                state.commit()
            if generation == 0 and rank == kill_rank and state.step == kill_step:
                with open(os.path.join(out, "killed"), "w") as f:
                    f.write(str(time.time()))
                os.kill(int(os.environ["HPCRING_RAY_ACTOR_PID"]), signal.SIGKILL)
                time.sleep(60)
        return {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "generation": generation,
            "sizes": list(state.sizes),
            "first_step_at": state.first_step_at,
            "weights": [p.detach().clone() for p in net.parameters()],
        }

    return train(state)


def schedule_reference(sizes: list[int], per_rank: int, seed: int) -> list[torch.Tensor]:
    """One process following the same schedule of world sizes on the combined batches: the weights an
    elastic run must end with (averaged gradients of equal slices = the combined batch's gradient)."""
    torch.set_num_threads(1)
    net = model(seed)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step, size in enumerate(sizes):
        x, y = step_data(step, size, per_rank, seed)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def raise_everywhere() -> None:
    """The function's own error, on every rank at once (not a lost worker)."""
    hvd.init()
    raise KeyError(f"no such key on rank {hvd.rank()}")


def kill_own_actor_on(rank: int) -> int:
    """`rank` SIGKILLs the Ray actor holding it while the others wait in a collective."""
    import signal
    import time

    hvd.init()
    if hvd.rank() == rank:
        os.kill(int(os.environ["HPCRING_RAY_ACTOR_PID"]), signal.SIGKILL)
        time.sleep(60)
    hvd.allreduce(torch.ones(1), name="waits-for-the-dead")
    return hvd.rank()
