"""`PartialDistributedOptimizer`: DistributedOptimizer for model-parallel layers whose gradients stay local.

Horovod 0.28 offers it for Keras (`horovod.keras.PartialDistributedOptimizer`, with `register_local_var` on
the optimizer; TensorFlow's `PartialDistributedGradientTape` likewise), and its semantics carry over as
they are: the parameters of `local_layers` are never reduced (no hook, no request, so ranks may hold
different local layers), everything else is reduced exactly as by DistributedOptimizer, and with
`scale_local_gradients` (the default) each local gradient is divided by the size of the process set once per
step, so that the local layers learn at the same rate as the averaged ones (Horovod pull 3695). At one rank
nothing is reduced and the division is by one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from hpcring import _deps
from hpcring.engine import ProcessSet, global_process_set
from hpcring.torch.compression import Compression, Compressor
from hpcring.torch.op_handles import Average, Sum
from hpcring.torch.optimizer import _DistributedOptimizer, _validate_groups, wrap_as


class _PartialDistributedOptimizer(_DistributedOptimizer):
    """DistributedOptimizer's methods, with the local parameters left out of every reduction."""

    _local_ids: set[int]
    _local: list[Any]
    scale_local_gradients: bool
    _local_scaled: bool  # this step's local gradients were divided already (synchronize twice)

    def _trainable(self) -> list[Any]:
        return [p for p in super()._trainable() if id(p) not in self._local_ids]

    def _make_hook(self, p: Any) -> Any:
        reduce_hook = super()._make_hook(p)
        pid = id(p)

        def hook(*args: Any) -> None:
            if pid not in self._local_ids:  # registered local after its hook was
                reduce_hook(*args)

        return hook

    def register_local_var(self, var: Any) -> None:
        """Keep `var`'s gradient local from the next step on (Horovod's Keras optimizer method)."""
        if id(var) not in self._local_ids:
            self._local_ids.add(id(var))
            self._local.append(var)
            self._check_due = True

    def synchronize(self) -> None:
        super().synchronize()
        if self.scale_local_gradients and self._reducing and not self._local_scaled:
            size = self.process_set.size() or 1
            for p in self._local:
                if p.grad is not None:
                    p.grad.div_(size)
            self._local_scaled = True

    def step(self, closure: Any = None) -> Any:
        try:
            return super().step(closure)
        finally:
            self._local_scaled = False

    step.hooked = True  # type: ignore[attr-defined]  # see _DistributedOptimizer.step

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        super().zero_grad(*args, **kwargs)
        self._local_scaled = False


def _local_parameters(local_layers: Any) -> list[Any]:
    """The parameters of `local_layers`: None, one Module or an iterable of Modules."""
    nn = _deps.torch().nn
    if local_layers is None:
        return []
    layers = (
        [local_layers] if isinstance(local_layers, nn.Module) else list(cast(Iterable[Any], local_layers))
    )
    if not all(isinstance(layer, nn.Module) for layer in layers):
        raise ValueError("All local layers must be of torch.nn.Module type.")
    params = [p for layer in layers for p in layer.parameters()]
    return list({id(p): p for p in params}.values())


def PartialDistributedOptimizer(
    optimizer: Any,
    named_parameters: Any = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    bucket_cap_mb: float | None = None,
) -> Any:
    """DistributedOptimizer whose `local_layers` (a Module or Modules) keep their gradients local.

    Arguments as DistributedOptimizer's; `op` is Average or Sum (as Horovod's). Without local layers it
    behaves as DistributedOptimizer. `register_local_var(param)` adds a local parameter later.
    """
    if op is None:
        op = Average
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is not None:
        _validate_groups(groups)
    local = _local_parameters(local_layers)
    wrapped = wrap_as(_PartialDistributedOptimizer, optimizer)
    wrapped._local_ids = {id(p) for p in local}
    wrapped._local = local
    wrapped.scale_local_gradients = bool(scale_local_gradients)
    wrapped._local_scaled = False
    wrapped._setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        bucket_cap_mb,
    )
    return wrapped
