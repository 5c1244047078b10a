"""DistributedOptimizer's gradient buckets (hpcring/torch/buckets.py), checked inside every rank.

The first step reduces per tensor and learns the readiness order; every later step reduces buckets whose
gradients are views of flat buffers. Each test runs several steps so the bucketed steps are the ones checked.
Each rank's loss is `(rank + 1) * Σ params` unless said otherwise, so the averaged gradient is
`(size + 1) / 2` everywhere and every expectation follows from rank and size.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from torch_train_helpers import make_model, params_sum_loss

STEPS = 3


def _mean(hvd: ModuleType) -> float:
    return (hvd.size() + 1) / 2


def _wrapped(hvd: ModuleType, model: torch.nn.Module, **kwargs: object) -> torch.optim.Optimizer:
    base = torch.optim.SGD(model.parameters(), lr=1.0)
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kwargs)


def _bucketed(hvd: ModuleType, opt: torch.optim.Optimizer) -> bool:
    """Whether this rank reduces through buckets (never at one rank, where nothing is reduced)."""
    return hvd.size() > 1


def _assert_grads_are_bucket_views(opt: torch.optim.Optimizer) -> None:
    for bucket in opt._buckets:  # type: ignore[attr-defined]
        lo = bucket.flat.data_ptr()
        hi = lo + bucket.flat.numel() * bucket.flat.element_size()
        for p in bucket.params:
            assert p.grad is not None and lo <= p.grad.data_ptr() < hi


def test_buckets_are_built_after_the_first_step_and_average(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, bucket_cap_mb=0.0002)  # ~200 bytes: several buckets for this small model
    for step in range(STEPS):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.step()
        for b, p in zip(before, model.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), b - _mean(hvd), atol=1e-5, rtol=0)
        if _bucketed(hvd, opt):
            assert opt._buckets is not None and len(opt._buckets) > 1, step  # type: ignore[attr-defined]
            _assert_grads_are_bucket_views(opt)


def test_ranks_that_see_gradients_in_different_orders_agree(hvd: ModuleType) -> None:
    """Odd ranks sum the parameters in reverse, so autograd makes their gradients ready in the reverse order;
    the buckets follow the root's order on every rank and the averages are right."""
    model = make_model(0)
    opt = _wrapped(hvd, model, bucket_cap_mb=0.0002)
    params = list(model.parameters())
    order = params if hvd.rank() % 2 == 0 else params[::-1]
    fired: list[int] = []
    spies = [
        p.register_post_accumulate_grad_hook(lambda _, i=i: fired.append(i)) for i, p in enumerate(params)
    ]
    for _ in range(STEPS):
        before = [p.detach().clone() for p in params]
        opt.zero_grad()
        loss = torch.zeros(())
        for p in order:
            loss = loss + (hvd.rank() + 1) * p.sum()
        loss.backward()
        opt.step()
        for b, p in zip(before, params, strict=True):
            torch.testing.assert_close(p.detach(), b - _mean(hvd), atol=1e-5, rtol=0)
    for spy in spies:
        spy.remove()
    orders = hvd.allgather_object(fired[: len(params)])
    if hvd.size() > 1:
        assert orders[0] != orders[1]  # the ranks really saw different orders
    if _bucketed(hvd, opt):
        layout = [[p.shape for p in b.params] for b in opt._buckets]  # type: ignore[attr-defined]
        assert all(other == layout for other in hvd.allgather_object(layout))


def test_parameter_unused_in_later_steps_neither_hangs_nor_corrupts(hvd: ModuleType) -> None:
    """A parameter with no gradient on a rank contributes zeros (DDP's find_unused_parameters case): `b` is
    used on rank 0 only, `c` on no rank at all (its gradient stays an average of zeros: never moves)."""
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 4))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([a, b, c], lr=1.0), named_parameters=[("a", a), ("b", b), ("c", c)]
    )
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        loss = (hvd.rank() + 1) * a.sum()
        if hvd.rank() == 0:
            loss = loss + b.sum()
        loss.backward()
        opt.step()
        torch.testing.assert_close(a.detach(), torch.full((3,), -step * _mean(hvd)))
        torch.testing.assert_close(b.detach(), torch.full((2,), -step / hvd.size()))
        torch.testing.assert_close(c.detach(), torch.zeros(4))


def test_frozen_unfrozen_and_added_parameters_rebuild_the_buckets(hvd: ModuleType) -> None:
    model = make_model(0)
    first, *rest = list(model.parameters())
    opt = _wrapped(hvd, model)

    def step() -> None:
        opt.zero_grad()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.step()

    step()
    step()
    first.requires_grad_(False)  # frozen: not reduced, not moved
    frozen = first.detach().clone()
    moving = [p.detach().clone() for p in rest]
    step()
    step()
    torch.testing.assert_close(first.detach(), frozen, atol=0, rtol=0)
    for b, p in zip(moving, rest, strict=True):
        torch.testing.assert_close(p.detach(), b - 2 * _mean(hvd), atol=1e-5, rtol=0)
    if _bucketed(hvd, opt):
        assert all(first is not p for b in opt._buckets for p in b.params)  # type: ignore[attr-defined]
    first.requires_grad_(True)  # unfrozen: reduced again
    extra = torch.nn.Parameter(torch.zeros(5))
    opt.add_param_group({"params": [extra]})  # added between steps: reduced from its first step
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        opt.zero_grad()
        (params_sum_loss(model, hvd.rank() + 1) + (hvd.rank() + 1) * extra.sum()).backward()
        opt.step()
    for b, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), b - 2 * _mean(hvd), atol=1e-5, rtol=0)
    torch.testing.assert_close(extra.detach(), torch.full((5,), -2 * _mean(hvd)))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_backward_passes_per_step_and_clipping_over_bucketed_steps(
    hvd: ModuleType, set_to_none: bool
) -> None:
    """Two passes per step accumulate in the bucket views; synchronize() gives the averages in `.grad`,
    clipping edits them, and step() under skip_synchronize() applies the clipped values."""
    model = make_model(0)
    opt = _wrapped(hvd, model, backward_passes_per_step=2)
    n = sum(p.numel() for p in model.parameters())
    for _ in range(STEPS):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad(set_to_none=set_to_none)
        params_sum_loss(model, hvd.rank() + 1).backward()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.synchronize()
        for p in model.parameters():
            torch.testing.assert_close(p.grad, torch.full_like(p, 2 * _mean(hvd)))
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        with opt.skip_synchronize():
            opt.step()
        for b, p in zip(before, model.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), b - 1.0 / n**0.5, atol=1e-5, rtol=0)


def test_model_zero_grad_and_an_extra_pass_are_handled(hvd: ModuleType) -> None:
    """`model.zero_grad()` (gradients None, bypassing the optimizer) is copied back into the buckets; a pass
    beyond backward_passes_per_step is refused in bucketed steps too, and zero_grad() is refused while a
    bucketed step is pending."""
    model = make_model(0)
    opt = _wrapped(hvd, model)
    for _ in range(STEPS):
        before = [p.detach().clone() for p in model.parameters()]
        model.zero_grad()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.step()
        for b, p in zip(before, model.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), b - _mean(hvd), atol=1e-5, rtol=0)
    if hvd.size() == 1:
        return
    opt.zero_grad()
    params_sum_loss(model, 1.0).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        params_sum_loss(model, 1.0).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize(("name", "atol"), [("fp16", 1e-3), ("bf16", 1e-2)])
def test_compressed_buckets(hvd: ModuleType, name: str, atol: float) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, compression=getattr(hvd.Compression, name))
    for _ in range(STEPS):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        params_sum_loss(model, hvd.rank() + 1.1).backward()
        opt.step()
        for b, p in zip(before, model.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), b - (_mean(hvd) + 0.1), atol=atol, rtol=0)
            assert p.grad.dtype == torch.float32


def test_load_state_dict_in_bucketed_steps(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, backward_passes_per_step=2)
    for _ in range(2):
        opt.zero_grad()
        params_sum_loss(model, 1.0).backward()
        params_sum_loss(model, 1.0).backward()
        opt.step()
    state = opt.state_dict()
    opt.zero_grad()
    params_sum_loss(model, 1.0).backward()  # one of two passes: nothing launched yet
    opt.load_state_dict(state)
    opt.zero_grad()  # allowed again: loading forgot the pending pass
    before = [p.detach().clone() for p in model.parameters()]
    params_sum_loss(model, hvd.rank() + 1).backward()
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.step()
    for b, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), b - 2 * _mean(hvd), atol=1e-5, rtol=0)


def test_bucket_cap_zero_keeps_one_request_per_gradient(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, bucket_cap_mb=0)
    for _ in range(2):
        opt.zero_grad()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.step()
    assert opt._buckets is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        _wrapped(hvd, make_model(0), bucket_cap_mb=-1)
