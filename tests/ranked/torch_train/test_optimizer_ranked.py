"""DistributedOptimizer contracts, checked inside every rank.

Each rank's loss is `(rank + 1) * Σ params`, so the local gradient is `rank + 1` everywhere and the averaged
gradient is `(size + 1) / 2`: every expectation below is computed from rank and size alone.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from torch_train_helpers import make_model, params_sum_loss


def _mean_scale(hvd: ModuleType) -> float:
    return (hvd.size() + 1) / 2


def _snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _wrapped(
    hvd: ModuleType, model: torch.nn.Module, lr: float = 1.0, **kwargs: object
) -> torch.optim.Optimizer:
    base = torch.optim.SGD(model.parameters(), lr=lr)
    return hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kwargs)


def _assert_moved_by(
    model: torch.nn.Module, before: list[torch.Tensor], delta: float, atol: float = 1e-5
) -> None:
    for b, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), b - delta, atol=atol, rtol=0)


@pytest.mark.parametrize(
    ("options", "passes", "step"),
    [
        pytest.param({}, 1, lambda n: (n + 1) / 2, id="average"),
        pytest.param({"op": "Sum"}, 1, lambda n: n * (n + 1) / 2, id="sum"),
        pytest.param({"gradient_predivide_factor": 4.0}, 1, lambda n: (n + 1) / 2, id="predivide"),
        pytest.param({"num_groups": 2}, 1, lambda n: (n + 1) / 2, id="num_groups-deprecated"),
        pytest.param({"backward_passes_per_step": 2}, 2, lambda n: 3 * (n + 1) / 2, id="two-passes"),
    ],
)
def test_one_step_moves_every_weight_by_the_reduced_gradient(
    hvd: ModuleType, options: dict[str, Any], passes: int, step: Callable[[int], float]
) -> None:
    """Pass k's loss is k (rank + 1) Σ params: one step (lr 1) moves every weight by `step(size)`. The
    deprecated `num_groups` warns and behaves as `groups`; two passes before a step average their sum."""
    options = {k: getattr(hvd, v) if k == "op" else v for k, v in options.items()}
    model = make_model(0)
    deprecated = "num_groups" in options
    with pytest.warns(DeprecationWarning, match="groups") if deprecated else contextlib.nullcontext():
        opt = _wrapped(hvd, model, **options)
    before = _snapshot(model)
    for k in range(1, passes + 1):
        params_sum_loss(model, k * (hvd.rank() + 1)).backward()
    opt.step()
    _assert_moved_by(model, before, step(hvd.size()))


def test_wrapper_is_a_subclass_of_the_wrapped_optimizer(hvd: ModuleType) -> None:
    model = make_model(0)
    base = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.5)
    base.state[next(model.parameters())]["marker"] = (
        7  # state already held by the optimizer survives wrapping
    )
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD)
    assert type(opt).__name__ == "SGD"
    assert opt.state[next(model.parameters())]["marker"] == 7
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    params_sum_loss(model, hvd.rank() + 1).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" warning
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.5


def test_optimizer_step_hooks_run_once(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model)
    calls: list[str] = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    params_sum_loss(model, 1.0).backward()
    opt.step()
    assert calls == ["pre", "post"]


@pytest.mark.parametrize("groups", [1, 2, "explicit"])
def test_grouped_allreduce_gives_the_same_average(hvd: ModuleType, groups: object) -> None:
    model = make_model(0)
    params = list(model.parameters())
    spec = [[params[0], params[3]], [params[1]]] if groups == "explicit" else groups
    opt = _wrapped(hvd, model, groups=spec)
    expected_groups = 3 if groups == "explicit" else groups  # params[2] becomes a group of its own
    if hvd.size() > 1:  # at one rank nothing is reduced, so no groups are formed (as Horovod)
        assert len(set(opt._p_to_group.values())) == expected_groups
    before = _snapshot(model)
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.step()
    _assert_moved_by(model, before, _mean_scale(hvd))


def test_groups_refuse_an_extra_pass(hvd: ModuleType) -> None:
    """With groups a parameter's own entry goes away once its group is launched: a second backward pass
    before step() must still be refused (Horovod asserts it)."""
    if hvd.size() == 1:
        pytest.skip("at one rank no hooks are registered and nothing is guarded, as in Horovod")
    model = make_model(0)
    opt = _wrapped(hvd, model, groups=1)
    params_sum_loss(model, hvd.rank() + 1).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        params_sum_loss(model, 1.0).backward()
    opt.step()
    opt.zero_grad()


def test_partial_group_guards_zero_grad_then_reduces_at_step(hvd: ModuleType) -> None:
    """A group whose members are only partly ready is pending: zero_grad() refuses (as Horovod's), and
    step() reduces the group, the member that got no gradient with zeros."""
    if hvd.size() == 1:
        pytest.skip("at one rank no hooks are registered and nothing is guarded, as in Horovod")
    model = make_model(0)
    first, second = list(model.parameters())[:2]
    opt = _wrapped(hvd, model, groups=[[first, second]])
    before = [first.detach().clone(), second.detach().clone()]
    ((hvd.rank() + 1) * first.sum()).backward()  # `second` gets no gradient
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    torch.testing.assert_close(first.detach(), before[0] - _mean_scale(hvd), atol=1e-5, rtol=0)
    torch.testing.assert_close(second.detach(), before[1], atol=0, rtol=0)
    opt.zero_grad()


def test_backward_passes_per_step_accumulates_locally(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, backward_passes_per_step=2)
    if hvd.size() == 1:
        pytest.skip("at one rank no hooks are registered and nothing is guarded, as in Horovod")
    params_sum_loss(model, hvd.rank() + 1).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()  # between the passes of one step: Horovod refuses too
    params_sum_loss(model, 2 * (hvd.rank() + 1)).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        params_sum_loss(model, 1.0).backward()  # a third pass before step()
    opt.step()  # the refused pass leaves the step usable: the reductions of pass two complete
    opt.zero_grad()

    opt.set_backward_passes_per_step(1)
    before = _snapshot(model)
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.step()
    _assert_moved_by(model, before, _mean_scale(hvd))


def test_synchronize_then_clip_then_step_under_skip_synchronize(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model)
    before = _snapshot(model)
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.synchronize()
    for p in model.parameters():
        torch.testing.assert_close(p.grad, torch.full_like(p, _mean_scale(hvd)))
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    with opt.skip_synchronize():
        opt.step()
    n = sum(p.numel() for p in model.parameters())
    _assert_moved_by(model, before, 1.0 / n**0.5)


def test_step_after_synchronize_without_skip_warns(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model)
    params_sum_loss(model, 1.0).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_zero_grad_refused_while_reductions_pending(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model)
    params_sum_loss(model, 1.0).backward()
    if hvd.size() > 1:  # at one rank there are no hooks and nothing is pending, as in Horovod
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_parameter_unused_on_one_rank_still_reduces(hvd: ModuleType) -> None:
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b], lr=1.0), named_parameters=[("a", a), ("b", b)])
    loss = (hvd.rank() + 1) * a.sum()
    if hvd.rank() != 0:
        loss = loss + b.sum()
    loss.backward()
    opt.step()
    torch.testing.assert_close(a.detach(), torch.full((3,), -_mean_scale(hvd)))
    torch.testing.assert_close(b.detach(), torch.full((2,), -(hvd.size() - 1) / hvd.size()))


@pytest.mark.parametrize(("name", "atol"), [("fp16", 1e-3), ("bf16", 1e-2)])
def test_compressed_gradients_average_within_tolerance(hvd: ModuleType, name: str, atol: float) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, lr=0.1, compression=getattr(hvd.Compression, name))
    before = _snapshot(model)
    params_sum_loss(model, hvd.rank() + 1.1).backward()
    opt.step()
    _assert_moved_by(model, before, 0.1 * (_mean_scale(hvd) + 0.1), atol=atol)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_gradients(hvd: ModuleType, sparse_as_dense: bool) -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(hvd.size() + 1, 2, sparse=True)
    before = emb.weight.detach().clone()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=1.0),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    emb(torch.tensor([0, hvd.rank() + 1])).sum().backward()
    opt.step()
    expected = before.clone()
    expected[0] -= 1.0  # every rank looked up row 0: the average of ones
    expected[1:] -= 1.0 / hvd.size()  # row r+1 only on rank r
    torch.testing.assert_close(emb.weight.detach(), expected)


def test_load_state_dict_resets_accumulation(hvd: ModuleType) -> None:
    model = make_model(0)
    opt = _wrapped(hvd, model, backward_passes_per_step=2)
    state = opt.state_dict()
    params_sum_loss(model, 1.0).backward()  # one of two passes: nothing launched yet
    opt.load_state_dict(state)
    opt.zero_grad()  # allowed again: loading forgot the pending pass
    before = _snapshot(model)
    params_sum_loss(model, hvd.rank() + 1).backward()
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.step()
    _assert_moved_by(model, before, 2 * _mean_scale(hvd))


# --- errors raised synchronously, before any collective, on every rank ---


# (hvd, parameters, named parameters) -> the options DistributedOptimizer refuses, and the error's text
REFUSED = [
    pytest.param(
        lambda hvd, ps, named: {"named_parameters": [("same", p) for p in ps]},
        r"unique.*same",
        id="duplicate-names",
    ),
    pytest.param(lambda hvd, ps, named: {"named_parameters": named[:-1]}, "not named", id="missing-name"),
    pytest.param(lambda hvd, ps, named: {"named_parameters": ps}, "tuples", id="names-not-tuples"),
    *(
        pytest.param(lambda hvd, ps, named, g=g: {"groups": g}, "groups", id=f"groups-{g}")
        for g in (-1, 0, True, "two")
    ),
    pytest.param(lambda hvd, ps, named: {"groups": [[ps[0]], [ps[0]]]}, "groups", id="groups-dup"),
    pytest.param(lambda hvd, ps, named: {"groups": [[ps[0], "x"]]}, "groups", id="groups-not-a-tensor"),
    pytest.param(
        lambda hvd, ps, named: {"op": hvd.Sum, "gradient_predivide_factor": 2.0},
        "gradient_predivide_factor",
        id="predivide-needs-average",
    ),
    pytest.param(
        lambda hvd, ps, named: {"op": hvd.Adasum, "gradient_predivide_factor": 2.0},
        "gradient_predivide_factor",
        id="adasum-predivide",
    ),
]


@pytest.mark.parametrize(("options", "match"), REFUSED)
def test_bad_options_raise_value_error(
    hvd: ModuleType, options: Callable[..., dict[str, Any]], match: str
) -> None:
    model = make_model(0)
    params, named = list(model.parameters()), list(model.named_parameters())
    with pytest.raises(ValueError, match=match):
        hvd.DistributedOptimizer(
            torch.optim.SGD(params, lr=1.0), **{"named_parameters": named, **options(hvd, params, named)}
        )


def test_one_rank_reduces_nothing_step_after_step(hvd: ModuleType) -> None:
    """As Horovod: at one rank DistributedOptimizer registers no hooks and submits nothing, in any step (it
    once registered them at the first synchronize() and reduced per tensor from the second step on)."""
    from hpcring.torch import basics

    model = make_model(0)
    opt = _wrapped(hvd, model, lr=0.1)
    stats = basics.engine().stats
    before = stats["batches"]
    for _ in range(3):
        opt.zero_grad()
        params_sum_loss(model, hvd.rank() + 1).backward()
        opt.step()
    if hvd.size() == 1:
        assert stats["batches"] == before
    else:
        assert stats["batches"] > before
    _assert_moved_by(model, _snapshot(make_model(0)), 3 * 0.1 * _mean_scale(hvd))
