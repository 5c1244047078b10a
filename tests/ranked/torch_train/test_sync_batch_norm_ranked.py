"""SyncBatchNorm at N ranks equals torch's BatchNorm applied to the concatenation of all ranks' batches.

Every rank builds the whole global batch from a fixed seed, takes its own slice for SyncBatchNorm and runs the
reference BatchNorm on all of it: forward output, running statistics and the input gradient of its slice must
match, and the weight/bias gradients summed over ranks must match the reference's.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch


def _rows(rank: int) -> slice:
    """Uneven shares (rank r holds r + 2 samples), so the counts must be weighted correctly."""
    start = sum(r + 2 for r in range(rank))
    return slice(start, start + rank + 2)


def _pair(hvd: ModuleType, channels: int, dims: int, momentum: float | None) -> tuple[torch.nn.Module, ...]:
    bn_cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[dims]
    ref = bn_cls(channels, momentum=momentum)
    sync = hvd.SyncBatchNorm(channels, momentum=momentum)
    torch.manual_seed(3)
    with torch.no_grad():
        for m in (ref, sync):
            m.weight.copy_(torch.linspace(0.5, 1.5, channels))
            m.bias.copy_(torch.linspace(-1.0, 1.0, channels))
    return ref, sync


@pytest.mark.parametrize("dims", [2, 3, 4])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_forward_backward_match_batchnorm_on_the_global_batch(
    hvd: ModuleType, dims: int, momentum: float | None
) -> None:
    channels, total = 3, sum(r + 2 for r in range(hvd.size()))
    gen = torch.Generator().manual_seed(7)
    shape = (total, channels, *([5] * (dims - 2)))
    x_all = torch.randn(shape, generator=gen) * 3 + 1
    dy_all = torch.randn(shape, generator=gen)
    ref, sync = _pair(hvd, channels, dims, momentum)

    for _ in range(2):  # two batches: running statistics accumulate the same way
        x_ref = x_all.clone().requires_grad_()
        y_ref = ref(x_ref)
        (y_ref * dy_all).sum().backward()
        x = x_all[_rows(hvd.rank())].clone().requires_grad_()
        y = sync(x)
        (y * dy_all[_rows(hvd.rank())]).sum().backward()

        torch.testing.assert_close(y, y_ref[_rows(hvd.rank())], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.grad, x_ref.grad[_rows(hvd.rank())], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sync.running_mean, ref.running_mean)
    torch.testing.assert_close(sync.running_var, ref.running_var)
    assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked) == 2
    for name in ("weight", "bias"):
        local = getattr(sync, name).grad
        total_grad = hvd.allreduce(local, op=hvd.Sum, name=f"syncbn.{name}.{dims}.{momentum}")
        torch.testing.assert_close(total_grad, getattr(ref, name).grad, atol=1e-4, rtol=1e-5)

    ref.eval()
    sync.eval()
    x = x_all[_rows(hvd.rank())]
    torch.testing.assert_close(sync(x), ref(x_all)[_rows(hvd.rank())], atol=1e-5, rtol=1e-5)


def test_convert_sync_batchnorm_keeps_state(hvd: ModuleType) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.fill_(0.25)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm)
    assert torch.equal(converted[1].running_mean, torch.full((2,), 0.25))
    out = converted(torch.randn(2, 1, 5, 5))
    assert out.shape == (2, 2, 3, 3)


def test_rejects_one_dimensional_input(hvd: ModuleType) -> None:
    with pytest.raises(ValueError, match="2D"):
        hvd.SyncBatchNorm(3)(torch.zeros(3))
