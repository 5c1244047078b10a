"""PartialDistributedOptimizer and DistributedOptimizer(sparse_as_dense=True), as a Horovod script uses them
(`import horovod.torch as hvd`), at 1, 2 and 4 ranks; every expectation is computed from rank and size.

Horovod's semantics (horovod/torch/optimizer.py and horovod/_keras, 0.28): a sparse gradient with
sparse_as_dense is densified, averaged, and stored back sparse (`to_sparse()`, so element-wise COO over the
nonzeros); at one rank nothing is reduced and the gradient is autograd's own. Partial: local layers are never
reduced and their gradients are divided by the set's size (scale_local_gradients) when the optimizer reduces.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

LR = 0.1


def _shared_and_local(local_out: int) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """Two layers with fixed weights: `shared` (the same on every rank) feeds `local`, whose output size
    may differ by rank (only a layer that is never reduced can)."""
    shared, local = nn.Linear(3, 2), nn.Linear(2, local_out)
    with torch.no_grad():
        shared.weight.copy_(torch.arange(6.0).reshape(2, 3) / 10)
        shared.bias.fill_(0.5)
        local.weight.fill_(0.25)
        local.bias.fill_(-0.5)
    return nn.Sequential(shared, local), shared, local


def _plain_grads(rank: int, local_out: int) -> list[torch.Tensor]:
    """The gradients rank `rank`'s batch gives, with no optimizer wrapped around the model."""
    model, _, _ = _shared_and_local(local_out)
    (model(torch.full((1, 3), float(rank + 1))) ** 2).sum().backward()
    return [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
def test_partial_optimizer_keeps_local_layers_local(horovod_torch: ModuleType, scale: bool) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    local_out = rank + 1  # a different shape on every rank: reducing it would fail
    model, _, local = _shared_and_local(local_out)
    opt = hvd.PartialDistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR),
        named_parameters=model.named_parameters(),
        local_layers=local,
        scale_local_gradients=scale,
    )
    for step in range(2):  # the first step reduces per tensor, the second through the buckets
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        (model(torch.full((1, 3), float(rank + 1))) ** 2).sum().backward()
        opt.synchronize()
        own = _plain_grads(rank, local_out) if step == 0 else None
        if own is not None:
            # the shared layer's gradient depends on the local layer, whose shape is the rank's: average
            # what each rank would compute with its own local layer
            every = [_plain_grads(r, r + 1) for r in range(size)]
            for i in (0, 1):
                expected = torch.stack([g[i] for g in every]).mean(0)
                torch.testing.assert_close(list(model.parameters())[i].grad, expected)
            divisor = size if scale else 1
            for i in (2, 3):
                torch.testing.assert_close(list(model.parameters())[i].grad, own[i] / divisor)
        grads = [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]
        with opt.skip_synchronize():
            opt.step()
        for b, g, p in zip(before, grads, model.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), b - LR * g)


def test_partial_optimizer_without_local_layers_is_distributed(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    model, _, _ = _shared_and_local(1)
    opt = hvd.PartialDistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters()
    )
    (model(torch.full((1, 3), float(rank + 1))) ** 2).sum().backward()
    opt.synchronize()
    every = [_plain_grads(r, 1) for r in range(size)]
    for i, p in enumerate(model.parameters()):
        torch.testing.assert_close(p.grad, torch.stack([g[i] for g in every]).mean(0))
    with opt.skip_synchronize():
        opt.step()


def test_register_local_var_keeps_a_parameter_local(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    model, _, local = _shared_and_local(1)
    opt = hvd.PartialDistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters()
    )
    opt.register_local_var(local.bias)
    (model(torch.full((1, 3), float(rank + 1))) ** 2).sum().backward()
    opt.synchronize()
    every = [_plain_grads(r, 1) for r in range(size)]
    for i, p in enumerate(model.parameters()):
        expected = every[rank][i] / size if i == 3 else torch.stack([g[i] for g in every]).mean(0)
        torch.testing.assert_close(p.grad, expected)
    with opt.skip_synchronize():
        opt.step()


def _rows(rank: int) -> list[int]:
    return [rank % 6, 7, 7]


def _dense_grad(rank: int) -> torch.Tensor:
    """Rank `rank`'s embedding gradient as a dense tensor: one per lookup of each row."""
    g = torch.zeros(8, 2)
    for row in _rows(rank):
        g[row] += 1.0
    return g


def test_sparse_as_dense_matches_horovod(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    rank, size = hvd.rank(), hvd.size()
    emb = nn.Embedding(8, 2, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.arange(16.0).reshape(8, 2))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=LR),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=True,
    )
    mean = torch.stack([_dense_grad(r) for r in range(size)]).mean(0)
    for _ in range(2):  # sparse gradients stay out of the buckets: the same in the second step
        before = emb.weight.detach().clone()
        opt.zero_grad()
        emb(torch.tensor(_rows(rank))).sum().backward()
        opt.synchronize()
        grad: Any = emb.weight.grad
        assert grad.is_sparse  # as Horovod: densified for the allreduce, stored back sparse
        if size == 1:  # nothing is reduced at one rank: autograd's own gradient
            assert grad.sparse_dim() == 1
            torch.testing.assert_close(grad.to_dense(), _dense_grad(rank))
        else:
            assert grad.sparse_dim() == 2  # dense.to_sparse(): element-wise over the nonzeros
            torch.testing.assert_close(grad.to_dense(), mean)
            nonzero = sorted(map(tuple, mean.nonzero().tolist()))
            assert sorted(map(tuple, grad.coalesce().indices().t().tolist())) == nonzero
        with opt.skip_synchronize():
            opt.step()
        expected = _dense_grad(rank) if size == 1 else mean
        torch.testing.assert_close(emb.weight.detach(), before - LR * expected)
