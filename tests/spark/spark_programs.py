"""Functions the Spark tests run on the executors (importable there by name: this folder is on their path)."""

from __future__ import annotations

from typing import Any


def layout_and_sum() -> tuple[int, int, int, int, float]:
    """This rank's place in the world and an allreduce (sum) of rank + 1 across it."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), float(total.item())


def scaled(factor: int, *, offset: int = 0) -> dict[str, Any]:
    """f(rank, size) with the args and kwargs that `run` passes, without torch."""
    import hpcring.torch as hvd

    hvd.init()
    return {"rank": hvd.rank(), "value": factor * hvd.rank() + offset * hvd.size()}


def raise_on(bad_rank: int) -> None:
    """`bad_rank` raises while the others wait for it in an allreduce (they would hang without the error)."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    if hvd.rank() == bad_rank:
        raise ValueError(f"boom from rank {bad_rank}")
    hvd.allreduce(torch.ones(1), op=hvd.Sum)


def exit_on(bad_rank: int) -> None:
    """`bad_rank`'s worker process dies outright (no exception to report) while the others wait for it."""
    import os

    import torch

    import hpcring.torch as hvd

    hvd.init()
    if hvd.rank() == bad_rank:
        os._exit(3)
    hvd.allreduce(torch.ones(1), op=hvd.Sum)


def _note_pid(pid_dir: str) -> None:
    """Write this rank's task process (the Spark Python worker that started this worker) to
    `pid_dir/<generation>.<rank>`, for the test that kills it or its executor."""
    import os

    import hpcring.torch as hvd

    generation = os.environ.get("HPCRING_ELASTIC_GENERATION", "0")
    path = os.path.join(pid_dir, f"{generation}.{hvd.rank()}")
    with open(path + ".tmp", "w") as out:
        out.write(os.environ["HPCRING_RAY_ACTOR_PID"])
    os.replace(path + ".tmp", path)


def allreduce_until_killed(pid_dir: str, seconds: float) -> int:
    """Every rank notes its task's pid, then allreduces for `seconds` (the test kills a rank meanwhile)."""
    import time

    import torch

    import hpcring.torch as hvd

    hvd.init()
    _note_pid(pid_dir)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hvd.allreduce(torch.ones(1), op=hvd.Sum)
        time.sleep(0.05)
    return hvd.rank()


SAMPLES = 12  # divisible by every world size the elastic test may form (1, 2, 3, 4)


def regression_data() -> tuple[Any, Any]:
    """A small full-batch least-squares problem, the same on every rank and in the test."""
    import torch

    x = torch.linspace(-1.0, 1.0, SAMPLES * 3).reshape(SAMPLES, 3)
    y = x @ torch.tensor([[0.5], [-1.0], [2.0]]) + 0.25
    return x, y


def regression_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def elastic_regression(pid_dir: str, epochs: int, epoch_s: float) -> dict[str, Any]:
    """Elastic full-batch gradient descent: each rank's shard loss is scaled so that the average of the
    ranks' gradients is the full batch's, whatever the world size. Commits after every epoch; the state
    records each world's start (generation, size, first epoch, wall-clock time) and each epoch's world
    size."""
    import os
    import time

    import torch

    import hpcring.torch as hvd

    hvd.init()
    _note_pid(pid_dir)
    model = regression_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, epochs_seen=[], starts=[])

    @hvd.elastic.run
    def train(state: Any) -> None:
        generation = int(os.environ.get("HPCRING_ELASTIC_GENERATION", "0"))
        state.starts = [*state.starts, (generation, hvd.size(), state.epoch, time.time())]
        while state.epoch < epochs:
            rows = slice(hvd.rank(), SAMPLES, hvd.size())
            optimizer.zero_grad()
            loss = ((model(x[rows]) - y[rows]) ** 2).sum() * hvd.size() / SAMPLES
            loss.backward()
            for p in model.parameters():
                p.grad = hvd.allreduce(p.grad, op=hvd.Average)
            optimizer.step()
            state.epochs_seen = [*state.epochs_seen, (state.epoch, hvd.size())]
            state.epoch += 1
            time.sleep(epoch_s)
            state.commit()
            if hvd.rank() == 0:  # the test kills a rank once a few epochs are committed
                note = os.path.join(pid_dir, f"committed.{generation}")
                with open(note + ".tmp", "w") as out:
                    out.write(str(state.epoch))
                os.replace(note + ".tmp", note)

    train(state)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"weights": weights.tolist(), "epochs_seen": state.epochs_seen, "starts": state.starts}


def executable() -> tuple[int, str]:
    """(rank, the Python this rank's worker runs): the executors' Python, as hpcring.spark chose it."""
    import sys

    import hpcring.torch as hvd

    hvd.init()
    return hvd.rank(), sys.executable
