"""`DistributedOptimizer(op=hvd.Adasum)`: Horovod's delta optimizer (`_DistributedAdasumOptimizer`).

Adasum needs the full magnitude of each rank's update, so the ranks do not reduce gradients: once a
parameter's gradient has been accumulated `backward_passes_per_step` times, its hook runs the wrapped
optimizer's step on that parameter alone, takes the delta (new value minus the value before), and starts an
in-place Adasum allreduce of the delta, while backward goes on. `step()` waits for each delta and sets the
parameter to its starting value plus the combined delta, so every rank ends the step with the same weights.
As Horovod: `step()` before the last pass reduces what the parameters have at once; a parameter whose hook
never ran is stepped and reduced in `step()`; `synchronize()` does nothing and `skip_synchronize()` is
refused; `zero_grad()` between backward and `step()` is refused. At one rank Horovod keeps the plain wrapper,
and so does `DistributedOptimizer` (optimizer.py).

Unlike Horovod's, the wrapped optimizer's state is kept (as hpcring's plain wrapper does), the rank rules
are checked at construction, on every rank (`adasum_rules.py`), and a parameter's hook is a
post-accumulate-grad hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from hpcring import _deps
from hpcring.engine import ProcessSet
from hpcring.torch import adasum_rules
from hpcring.torch.allreduce_ops import allreduce_async_
from hpcring.torch.compression import Compressor
from hpcring.torch.op_handles import Adasum
from hpcring.torch.op_handles import synchronize as wait_for
from hpcring.torch.tensors import _check_dtype

_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)
_ZERO_GRAD_RACE = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)


class _DistributedAdasumOptimizer:
    """Mixed in before the wrapped optimizer's class; `_setup_adasum` replaces Horovod's __init__."""

    param_groups: list[dict[str, Any]]
    _compression: type[Compressor]
    _parameter_names: dict[Any, str]
    backward_passes_per_step: int
    _allreduce_delay: dict[Any, int]
    _handles: dict[Any, tuple[Any, Any]]
    _requires_update: list[Any]
    _starting_models: dict[Any, Any]
    _hook_handles: list[Any]

    def _setup_adasum(
        self, named_parameters: Any, compression: type[Compressor], backward_passes_per_step: int
    ) -> None:
        torch = _deps.torch()
        self._compression = compression
        self._parameter_names = _names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self._handles = {}
        self._requires_update = []
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in self._parameter_names}
        self._hook_handles = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    self._requires_update.append(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_grad_async(self, p: Any) -> tuple[Any, Any]:
        """Step the wrapped optimizer on `p` alone, turn `p` into its delta and start its Adasum."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.copy_(p.detach())
            super().step()  # type: ignore[misc]
            p.detach().sub_(start)
            compressed, ctx = self._compression.compress(p.detach())
            handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum)
        finally:
            for group, params in zip(self.param_groups, stashed, strict=True):
                group["params"] = params
        return handle, ctx

    def _make_hook(self, p: Any) -> Any:
        def hook(*_: Any) -> None:
            pending = self._handles.get(p)
            if pending is not None and pending[0] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        """Nothing to do: the deltas are waited for in step() (as Horovod)."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover (a generator, for the context manager)

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if p not in self._handles:  # its hook never ran this step
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # step() before backward_passes_per_step passes
                handle, ctx = self._allreduce_grad_async(p)
            delta = self._compression.decompress(wait_for(handle), ctx)
            start = self._starting_models[p]
            start.add_(delta)
            p.detach().copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._handles:
            raise AssertionError(_ZERO_GRAD_RACE)
        super().zero_grad(*args, **kwargs)  # type: ignore[misc]


def _names(param_groups: list[dict[str, Any]], named_parameters: Any) -> dict[Any, str]:
    """Parameter -> name, checked as Horovod checks them (tuples, unique names, every parameter named)."""
    if named_parameters is None:
        named = [
            (f"allreduce.noname.{i}", v) for group in param_groups for i, v in enumerate(group["params"])
        ]
    else:
        named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), usually produced by "
            "model.named_parameters()."
        )
    names = [k for k, _ in named]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError(
            f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}"
        )
    named_ids = {id(v) for _, v in named}
    unnamed = [id(v) for group in param_groups for v in group["params"] if id(v) not in named_ids]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not named. Python object "
            f"ids: {', '.join(str(i) for i in unnamed)}"
        )
    return {v: k for k, v in sorted(named, key=lambda kv: kv[0])}


def adasum_optimizer(
    optimizer: Any,
    named_parameters: Any,
    compression: type[Compressor],
    backward_passes_per_step: int,
    process_set: ProcessSet | None,
) -> Any:
    """`optimizer` wrapped as Horovod's Adasum optimizer (more than one rank); refused, on every rank, where
    Horovod's Adasum is (`adasum_rules.py`)."""
    what = "DistributedOptimizer(op=Adasum)"
    checked: set[tuple[str, str]] = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            key = (_check_dtype(p, what), adasum_rules.route_of(p))
            if key not in checked:
                checked.add(key)
                adasum_rules.check(key[0], key[1], process_set, what)
    if not checked:
        adasum_rules.check("float32", "cpu", process_set, what)
    base = optimizer.__class__
    cls = type(
        base.__name__,
        (_DistributedAdasumOptimizer, base),
        {"__module__": _DistributedAdasumOptimizer.__module__},
    )
    wrapped = cast(Any, object.__new__(cls))
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    wrapped._setup_adasum(named_parameters, compression, backward_passes_per_step)
    return wrapped
