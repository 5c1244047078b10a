"""Models and data of the estimator tests (importable on the executors by name: this folder is on their
path), and the single-process reference training the distributed runs are compared with."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

ROWS = 64


class TwoInputs(torch.nn.Module):
    """forward(x, s): a linear map of an array feature x (3 values) and a scalar feature s."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([x, s], dim=1))


def data(rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features [rows, 4] and a noisy linear label [rows]."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4))
    y = x @ np.array([1.5, -2.0, 0.5, 3.0]) + 0.25 + 0.1 * rng.normal(size=rows)
    return x, y


def mae(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output - label).abs().mean()


def reference(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch: int, epochs: int, lr: float, momentum: float
) -> tuple[torch.nn.Module, list[float], list[float]]:
    """One process trained on the rows in order with batch `batch` (SGD, MSE), from a copy of `model`:
    what num_proc ranks with batch/num_proc rows each and the learning rate scaled by num_proc compute.
    A TwoInputs model gets x's first three columns and its last one; another model all four. Also returns
    each epoch's mean loss and mean absolute error over its steps."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    xs = torch.tensor(x, dtype=torch.float32)
    ys = torch.tensor(y, dtype=torch.float32).reshape(-1, 1)
    loss = torch.nn.MSELoss()
    losses, maes = [], []
    for _ in range(epochs):
        step_losses, step_maes = [], []
        for start in range(0, len(y) - batch + 1, batch):
            rows = xs[start : start + batch]
            out = model(rows[:, :3], rows[:, 3:]) if isinstance(model, TwoInputs) else model(rows)
            opt.zero_grad()
            value = loss(out, ys[start : start + batch])
            value.backward()
            opt.step()
            step_losses.append(float(value.detach()))
            step_maes.append(float(mae(out.detach(), ys[start : start + batch])))
        losses.append(float(np.mean(step_losses)))
        maes.append(float(np.mean(step_maes)))
    return model, losses, maes


def record_epoch(folder: str, epoch: int, entry: dict[str, Any]) -> None:
    """A callback: each rank writes the epoch's history entry where the test finds it."""
    import json

    import hpcring.torch as hvd

    with open(f"{folder}/epoch{epoch}-rank{hvd.rank()}.json", "w") as f:
        json.dump(entry, f)
