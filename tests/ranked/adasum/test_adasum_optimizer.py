"""DistributedOptimizer(op=hvd.Adasum): Horovod's delta optimizer. Each rank steps its own optimizer on its
own gradient; the parameter deltas are combined by Adasum; every rank ends each step with the same weights,
equal to a reference that replays every rank's local step in this process and combines the deltas with the
NumPy Adasum (adasum_reference.py)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from adasum_cases import DEVICE, expected

F = torch.nn.functional


@pytest.fixture(autouse=True)
def _power_of_two(hvd: ModuleType) -> None:
    n = hvd.size()
    if n & (n - 1):
        pytest.skip("Adasum is refused at this world size (test_adasum_ranks.py)")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def batch(rank: int, step: int, part: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + 100 * part + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def reference_step(
    hvd: ModuleType, refs: list[torch.nn.Module], opts: list[Any], step: int, passes: int
) -> None:
    """Every rank's local step (its own data, its own optimizer state), then start + Adasum(deltas)."""
    starts = [[p.detach().clone() for p in m.parameters()] for m in refs]
    deltas = []
    for q, (m, o) in enumerate(zip(refs, opts, strict=True)):
        o.zero_grad()
        for part in range(passes):
            x, y = batch(q, step, part)
            F.mse_loss(m(x), y).backward()
        o.step()
        deltas.append([(p.detach() - s).numpy() for p, s in zip(m.parameters(), starts[q], strict=True)])
    combined = expected(hvd, deltas) if len(refs) > 1 else deltas[0]
    with torch.no_grad():
        for m, start in zip(refs, starts, strict=True):
            for p, s, d in zip(m.parameters(), start, combined, strict=True):
                p.copy_(s + torch.from_numpy(d))


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("kind", ["sgd-momentum", "adam"])
def test_steps_match_the_reference_on_every_rank(hvd: ModuleType, kind: str, passes: int) -> None:
    r, n = hvd.rank(), hvd.size()

    def optim(m: torch.nn.Module) -> Any:
        if kind == "adam":
            return torch.optim.Adam(m.parameters(), lr=0.01)
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    model = make_model().to(DEVICE)
    opt = hvd.DistributedOptimizer(
        optim(model),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
        backward_passes_per_step=passes,
    )
    refs = [make_model() for _ in range(n)]
    ref_opts = [optim(m) for m in refs]
    for step in range(4):
        opt.zero_grad()
        for part in range(passes):
            x, y = batch(r, step, part)
            F.mse_loss(model(x.to(DEVICE)), y.to(DEVICE)).backward()
        opt.step()
        reference_step(hvd, refs, ref_opts, step, passes)
        for p, want in zip(model.parameters(), refs[r].parameters(), strict=True):
            np.testing.assert_allclose(p.detach().cpu().numpy(), want.detach().numpy(), rtol=2e-5, atol=2e-6)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0))
    assert all(torch.equal(row, flat) for row in every)  # the same weights on every rank, bit for bit


def test_horovods_contracts(hvd: ModuleType) -> None:
    """synchronize() does nothing, skip_synchronize() and zero_grad() before step() are refused, a pass too
    many is refused, step() before the last pass reduces what there is, and the weights stay equal."""
    model = make_model().to(DEVICE)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
        backward_passes_per_step=2,
    )
    if hvd.size() == 1:  # Horovod keeps the plain wrapper at one rank
        return
    with pytest.raises(AssertionError, match="Skipping synchronization"), opt.skip_synchronize():
        pass
    x, y = (t.to(DEVICE) for t in batch(hvd.rank(), 0))
    F.mse_loss(model(x), y).backward()
    opt.synchronize()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()  # one pass of two: reduced now
    F.mse_loss(model(x), y).backward()
    F.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        F.mse_loss(model(x), y).backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all(torch.equal(row, flat) for row in hvd.allgather(flat.unsqueeze(0)))


def test_refusals_name_the_rule(hvd: ModuleType) -> None:
    model = make_model()
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum, gradient_predivide_factor=2.0
        )
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum, backward_passes_per_step=0
        )
