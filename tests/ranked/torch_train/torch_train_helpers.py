"""Models and data shared by the ranked data-parallel tests; all of it depends only on seeds."""

from __future__ import annotations

import torch


def make_model(seed: int, d_in: int = 4, hidden: int = 8, d_out: int = 3) -> torch.nn.Module:
    """A small MLP whose weights depend only on `seed` (same seed, same model on every rank)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, d_out))


def params_sum_loss(model: torch.nn.Module, scale: float) -> torch.Tensor:
    """`scale * Σ params`: its gradient is `scale` everywhere, so averages are known in closed form."""
    return scale * sum((p.sum() for p in model.parameters()), torch.zeros(()))
