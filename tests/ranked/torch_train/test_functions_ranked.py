"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and allgather_object, in every rank.

Rank r builds its model from seed r, so ranks differ before a broadcast; after it every rank must hold what
the root built, which each rank recomputes locally from the root's seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from torch_train_helpers import make_model


def _assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


@pytest.mark.parametrize("form", ["state_dict", "named_parameters", "parameters"])
def test_broadcast_parameters_from_each_root(hvd: ModuleType, form: str) -> None:
    for root in {0, hvd.size() - 1}:
        model = make_model(seed=hvd.rank())
        params: Any = {
            "state_dict": lambda m: m.state_dict(),
            "named_parameters": lambda m: m.named_parameters(),  # a generator, as users pass it
            "parameters": lambda m: list(m.parameters()),
        }[form](model)
        hvd.broadcast_parameters(params, root_rank=root)
        _assert_same_model(model, make_model(seed=root))


@pytest.mark.parametrize("bad", [3, "weights", torch.zeros(2), [("w", 1.0)]])
def test_broadcast_parameters_rejects_non_tensors(hvd: ModuleType, bad: object) -> None:
    with pytest.raises(ValueError, match=r"params|torch\.Tensor"):
        hvd.broadcast_parameters(bad, root_rank=0)


def _closure_for(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> Callable[[], Any]:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    return closure


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "Adam-amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "Adadelta": lambda p: torch.optim.Adadelta(p),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=0.01),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=0.01),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=0.01),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=0.01),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=0.01),
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=3, history_size=4),
}


def _trained(name: str, rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Model and optimizer after rank-dependent training: rank r takes r + 1 steps on data seeded by r."""
    model = make_model(seed=0)
    opt = OPTIMIZERS[name](model.parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(rank + 1):
        opt.step(_closure_for(model, opt, torch.randn(5, 4, generator=gen)))
    for group in opt.param_groups:
        group["lr"] = 0.5 + rank  # options set on the root must propagate too
    return model, opt


def _assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for pid, state in want["state"].items():
        assert got["state"][pid].keys() == state.keys(), pid
        for key, value in state.items():
            _assert_same_value(got["state"][pid][key], value)


def _assert_same_value(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if torch.is_tensor(want):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same_value(g, w)
    else:
        assert got == want


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_broadcast_optimizer_state_gives_every_rank_the_roots_state(hvd: ModuleType, name: str) -> None:
    root = hvd.size() - 1
    model, opt = _trained(name, hvd.rank())
    hvd.broadcast_optimizer_state(opt, root, model)  # Horovod's positional form, model third
    _, expected = _trained(name, root)
    _assert_same_state(opt.state_dict(), expected.state_dict())
    assert opt.param_groups[0]["lr"] == 0.5 + root


def test_scalar_state_keeps_its_type(hvd: ModuleType) -> None:
    """Adam's `step` (a tensor) and LBFGS's `n_iter`/`func_evals` (ints) and `t` (a float) survive as such."""
    _, adam = _trained("Adam", hvd.rank())
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    step = next(iter(adam.state.values()))["step"]
    assert torch.is_tensor(step) and float(step) == 1.0  # rank 0 took one step
    _, lbfgs = _trained("LBFGS", hvd.rank())
    hvd.broadcast_optimizer_state(lbfgs, root_rank=0)
    state = next(iter(lbfgs.state.values()))
    assert type(state["n_iter"]) is int and type(state["func_evals"]) is int and type(state["t"]) is float
    _, reference = _trained("LBFGS", 0)
    assert state["n_iter"] == next(iter(reference.state.values()))["n_iter"]


def test_broadcast_optimizer_state_of_fresh_and_wrapped_optimizers(hvd: ModuleType) -> None:
    model = make_model(seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (hvd.rank() + 1))
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(dist, root_rank=0)
    assert dist.param_groups[0]["lr"] == 0.001
    assert len(dist.state) == 0  # rank 0 had no state: none is invented, and parameters are not touched
    for b, p in zip(before, model.parameters(), strict=True):
        assert torch.equal(b, p)
        assert p.grad is not None and not p.grad.any()  # zero gradients, as Horovod's zero step leaves


def test_broadcast_optimizer_state_leaves_zero_grads_on_trainable_parameters_only(hvd: ModuleType) -> None:
    """Horovod's own check (test_broadcast_state_no_grad): a frozen parameter keeps no gradient; a trainable
    one gets a zero gradient that is the same on every rank; a sparse embedding's is sparse."""
    frozen = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    trained = torch.nn.Parameter(torch.rand(4))
    opt = torch.optim.SGD([frozen, trained], lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=[("a", frozen), ("b", trained)])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert frozen.grad is None
    assert trained.grad is not None and torch.equal(hvd.broadcast(trained.grad, root_rank=0), trained.grad)
    embedding = torch.nn.Embedding(5, 2, sparse=True)
    hvd.broadcast_optimizer_state(torch.optim.SGD(embedding.parameters(), lr=0.1), 0, model=embedding)
    assert embedding.weight.grad is not None and embedding.weight.grad.is_sparse


@dataclasses.dataclass
class Payload:
    """A user-defined class, to show arbitrary picklable objects travel (module-level, so pickle finds it)."""

    name: str
    values: list[float]


def _object_for(rank: int) -> Any:
    return {
        "rank": rank,
        "nested": [(rank, "x" * rank), {"set": {rank, -rank}}, None],
        "array": np.arange(rank + 1, dtype=np.float32),
        "tensor": torch.full((2, rank + 1), float(rank)),
        "payload": Payload(f"rank{rank}", [0.5] * rank),
    }


def _assert_same_object(got: Any, want: Any) -> None:
    assert got.keys() == want.keys()
    assert got["nested"] == want["nested"] and got["payload"] == want["payload"]
    np.testing.assert_array_equal(got["array"], want["array"])
    assert torch.equal(got["tensor"], want["tensor"])


def test_broadcast_object(hvd: ModuleType) -> None:
    for root in {0, hvd.size() - 1}:
        obj = _object_for(hvd.rank()) if hvd.rank() == root else None
        _assert_same_object(hvd.broadcast_object(obj, root_rank=root), _object_for(root))
    assert hvd.broadcast_object("named", 0, name="custom-name") == "named"


def test_allgather_object(hvd: ModuleType) -> None:
    gathered = hvd.allgather_object(_object_for(hvd.rank()))
    assert len(gathered) == hvd.size()
    for r, got in enumerate(gathered):
        _assert_same_object(got, _object_for(r))
    assert hvd.allgather_object(None) == [None] * hvd.size()
