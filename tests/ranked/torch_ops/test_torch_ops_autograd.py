"""Gradients through the collectives follow Horovod's conventions (checked against closed forms)."""

from __future__ import annotations

from types import ModuleType

import torch


def test_allreduce_backward_allreduces_the_gradient(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((3,), float(r), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (r + 1)).sum().backward()  # grad of y on rank r is (r + 1): the Sum-allreduce of it is n(n+1)/2
    assert x.grad is not None and x.grad.tolist() == [n * (n + 1) / 2] * 3
    z = torch.ones(2, requires_grad=True)
    hvd.allreduce(z, op=hvd.Average, postscale_factor=2.0).sum().backward()
    assert torch.allclose(z.grad, torch.full((2,), 2.0))  # Average of ones, times the postscale


def test_allreduce_builds_a_graph_only_when_a_gradient_can_flow(hvd: ModuleType) -> None:
    """Without a gradient to carry (an input that does not require one, or grad mode off) allreduce skips the
    autograd Function; the result is the same tensor either way, with a graph only where one is needed."""
    n, r = hvd.size(), hvd.rank()
    want = torch.full((3,), float(n * (n - 1) // 2))
    plain = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum)
    assert plain.grad_fn is None and not plain.requires_grad and torch.equal(plain, want)
    w = torch.full((3,), float(r), requires_grad=True)
    tracked = hvd.allreduce(w, op=hvd.Sum)
    assert tracked.grad_fn is not None and torch.equal(tracked.detach(), want)
    with torch.no_grad():
        untracked = hvd.allreduce(w, op=hvd.Sum)
    assert untracked.grad_fn is None and not untracked.requires_grad and torch.equal(untracked, want)
    assert w.grad is None and torch.equal(w.detach(), torch.full((3,), float(r)))


def test_allgather_backward_average_then_slice(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(r + 1, 2, requires_grad=True)
    y = hvd.allgather(x)
    weights = torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1) * (r + 1)
    (y * weights).sum().backward()
    offset = sum(q + 1 for q in range(r))
    rows = torch.arange(offset, offset + r + 1, dtype=torch.float32).unsqueeze(1)
    mean_scale = sum(q + 1 for q in range(n)) / n
    assert torch.allclose(x.grad, (rows * mean_scale).expand(r + 1, 2))


def test_broadcast_backward_only_root_gets_gradient(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = torch.ones(4, requires_grad=True)
    (hvd.broadcast(x, root_rank=root) * (r + 1)).sum().backward()
    want = (n + 1) / 2 if r == root else 0.0
    assert torch.allclose(x.grad, torch.full((4,), want))


def test_reducescatter_backward_is_allgather(hvd: ModuleType) -> None:
    """Horovod's convention (test_horovod_reducescatter_grad{,_average}): the allgathered gradient, times the
    set's size for Sum, as is for Average."""
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(2 * n, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum)
    (y * (r + 1)).sum().backward()
    gathered = torch.cat([torch.full((2, 3), float(q + 1)) for q in range(n)])
    assert torch.equal(x.grad, gathered * n)
    x2 = torch.ones(2 * n, 3, requires_grad=True)
    (hvd.reducescatter(x2, op=hvd.Average) * (r + 1)).sum().backward()
    assert torch.allclose(x2.grad, gathered)
    x3 = torch.ones(2 * n, 3, requires_grad=True)  # Horovod's own check: ones in, ones back
    hvd.reducescatter(x3, op=hvd.Average).backward(torch.ones(2, 3))
    assert torch.equal(x3.grad, torch.ones(2 * n, 3))


def test_alltoall_backward_sends_gradients_home(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    splits = [q + 1 for q in range(n)]
    x = torch.ones(sum(splits), requires_grad=True)
    out, received = hvd.alltoall(x, splits=splits)
    assert received.tolist() == [r + 1] * n
    (out * (r + 1)).sum().backward()  # rows sent to rank j come back with gradient j + 1
    want = torch.cat([torch.full((j + 1,), float(j + 1)) for j in range(n)])
    assert torch.equal(x.grad, want)


def test_grouped_allreduce_backward(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * (r + 1)).sum() + (yb * 2).sum()).backward()
    assert a.grad.tolist() == [n * (n + 1) / 2] * 2 and b.grad.tolist() == [2.0 * n] * 3


def test_grouped_reducescatter_backward_matches_the_single_one(hvd: ModuleType) -> None:
    n = hvd.size()
    a = torch.ones(2 * n, 3, requires_grad=True)
    b = torch.ones(n, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_reducescatter([a, b], op=hvd.Sum)
    (ya.sum() + yb.sum()).backward()
    assert torch.equal(a.grad, torch.full((2 * n, 3), float(n)))
    assert torch.equal(b.grad, torch.full((n,), float(n), dtype=torch.float64))
