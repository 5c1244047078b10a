"""`SyncBatchNorm`: batch normalisation whose statistics cover the whole global batch, not one rank's share.

With small per-rank batches, each rank's own mean and variance are noisy; synchronising them makes training
at N ranks with batch b behave like one process with batch N·b. Forward reduces (count, sum, centred sum of
squares) in float64 with one allreduce; backward reduces (Σdy, Σdy·(x−μ)) with one more. The weight and bias
gradients stay local, as in PyTorch's and Horovod's SyncBatchNorm: `DistributedOptimizer` averages them like
any gradient.

Unlike Horovod's (which calls CUDA-only kernels), this one is written with plain tensor ops, so it runs on
CPU too.
"""

from __future__ import annotations

from typing import Any

from hpcring import _deps

_deps.require("torch")  # BackendUnavailable with the install command, instead of a bare ImportError

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.modules.batchnorm import _BatchNorm  # noqa: E402

from hpcring.torch import basics  # noqa: E402
from hpcring.torch.allreduce_ops import allreduce  # noqa: E402
from hpcring.torch.op_handles import Sum  # noqa: E402


def _allreduce_sum(tensor: torch.Tensor, process_set: Any) -> torch.Tensor:
    kw = {} if process_set is None else {"process_set": process_set}
    return allreduce(tensor, op=Sum, **kw)  # type: ignore[no-any-return]


def _shape(x: torch.Tensor) -> tuple[list[int], list[int]]:
    """Dimensions reduced over (all but channels) and the view that broadcasts a per-channel vector."""
    dims = [0, *range(2, x.dim())]
    view = [1, x.shape[1]] + [1] * (x.dim() - 2)
    return dims, view


class _SyncBatchNormFunction(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        momentum: float,
        process_set: Any,
    ) -> torch.Tensor:
        dims, view = _shape(x)
        channels = x.shape[1]
        count = x.numel() // channels
        if count > 0:
            local_mean = x.mean(dims)
            local_m2 = ((x - local_mean.view(view)) ** 2).sum(dims)
        else:
            local_mean = local_m2 = x.new_zeros(channels)
        mean64 = local_mean.double()
        stats = torch.cat([mean64.new_tensor([count]), mean64 * count, local_m2.double() + count * mean64**2])
        total = _allreduce_sum(stats, process_set)
        n = float(total[0])
        mean = total[1 : channels + 1] / n
        var = (total[channels + 1 :] / n - mean**2).clamp_(min=0.0)
        if running_mean is not None and running_var is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            unbiased = var * (n / (n - 1)) if n > 1 else var
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_x, invstd = mean.to(x.dtype), torch.rsqrt(var + eps).to(x.dtype)
        ctx.save_for_backward(x, weight, mean_x, invstd)
        ctx.n, ctx.process_set = n, process_set
        y = (x - mean_x.view(view)) * invstd.view(view)
        if weight is not None:
            y = y * weight.view(view)
        if bias is not None:
            y = y + bias.view(view)
        return y

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, mean, invstd = ctx.saved_tensors
        dims, view = _shape(x)
        channels = x.shape[1]
        xmu = x - mean.view(view)
        sum_dy = grad_out.sum(dims)
        sum_dy_xmu = (grad_out * xmu).sum(dims)
        grad_weight = sum_dy_xmu * invstd if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        total = _allreduce_sum(torch.cat([sum_dy, sum_dy_xmu]), ctx.process_set) / ctx.n
        mean_dy, mean_dy_xmu = total[:channels], total[channels:]
        scale = invstd if weight is None else invstd * weight
        grad_in = (grad_out - mean_dy.view(view) - xmu * (invstd**2 * mean_dy_xmu).view(view)) * scale.view(
            view
        )
        return grad_in, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):  # type: ignore[misc]
    """Drop-in for `torch.nn.BatchNorm{1,2,3}d` that normalises with statistics over all ranks' batches.

    In eval mode (with running stats) it behaves like plain BatchNorm; at one rank it is plain BatchNorm.
    `process_set` (an hpcring addition) limits the synchronisation to a subset of ranks.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _momentum(self) -> float:
        """Running-average factor for this batch: `momentum`, or 1/batches seen for a cumulative average."""
        if self.momentum is not None:
            return float(self.momentum)
        return 1.0 / float(self.num_batches_tracked) if self.num_batches_tracked is not None else 0.0

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        track = self.training and self.track_running_stats
        running_mean = self.running_mean if track or not self.training else None
        running_var = self.running_var if track or not self.training else None
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        if not use_batch_stats or basics.size() == 1:
            return F.batch_norm(
                input,
                running_mean,
                running_var,
                self.weight,
                self.bias,
                use_batch_stats,
                self._momentum(),
                self.eps,
            )
        return _SyncBatchNormFunction.apply(  # type: ignore[no-any-return]
            input,
            self.weight,
            self.bias,
            running_mean,
            running_var,
            self.eps,
            self._momentum(),
            self.process_set,
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_set: Any = None) -> torch.nn.Module:
        """Return `module` with every BatchNorm layer replaced by a SyncBatchNorm holding the same state."""
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out: torch.nn.Module = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
                process_set,
            )
            out.load_state_dict(module.state_dict())
            out.train(module.training)
        else:
            out = module
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out
