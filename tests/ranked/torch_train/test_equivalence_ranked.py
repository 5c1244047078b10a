"""The data-parallel proof: K steps at N ranks with batch b each equal K steps of one process with batch N·b.

Each rank trains the distributed model on its shard and, alongside, a plain single-process reference on the
whole global batch (the "one rank, batch N·b" run, computed in the same process from the same seeds). After K
steps the weights must agree to float tolerance, or to the compression's tolerance for fp16/bf16.
"""

from __future__ import annotations

import copy
from types import ModuleType

import pytest
import torch
from torch_train_helpers import make_model

STEPS, BATCH = 6, 4


def _data(size: int, passes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global data set: STEPS global batches of size·passes·BATCH samples (identical on every rank)."""
    gen = torch.Generator().manual_seed(11)
    n = STEPS * size * passes * BATCH
    x = torch.randn(n, 4, generator=gen)
    return x, torch.randint(0, 3, (n,), generator=gen)


def _optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)


@pytest.mark.parametrize(
    ("compression", "passes", "kind", "atol"),
    [
        ("none", 1, "sgd", 1e-5),
        ("none", 1, "adam", 1e-5),
        ("none", 2, "sgd", 1e-5),
        ("fp16", 1, "sgd", 1e-3),
        ("bf16", 1, "sgd", 1e-2),
        ("bf16", 2, "adam", 1e-2),
    ],
)
def test_data_parallel_steps_equal_one_process_with_the_global_batch(
    hvd: ModuleType, compression: str, passes: int, kind: str, atol: float
) -> None:
    size, rank = hvd.size(), hvd.rank()
    x, y = _data(size, passes)
    reference = make_model(seed=1)
    model = copy.deepcopy(reference)
    ref_opt = _optimizer(kind, reference)
    opt = hvd.DistributedOptimizer(
        _optimizer(kind, model),
        named_parameters=model.named_parameters(),
        compression=getattr(hvd.Compression, compression),
        backward_passes_per_step=passes,
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    global_batch = size * passes * BATCH
    for step in range(STEPS):
        start = step * global_batch
        ref_opt.zero_grad()
        loss_fn(reference(x[start : start + global_batch]), y[start : start + global_batch]).backward()
        ref_opt.step()

        opt.zero_grad()
        for micro in range(passes):  # rank r's shard: micro-batch `micro` of the rank's contiguous share
            lo = start + (rank * passes + micro) * BATCH
            (loss_fn(model(x[lo : lo + BATCH]), y[lo : lo + BATCH]) / passes).backward()
        opt.step()

    for (name, p_ref), p in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), p_ref.detach(), atol=atol, rtol=0, msg=f"{name} differs")
    with torch.no_grad():
        moved = sum(
            float((p - q).abs().sum())
            for p, q in zip(reference.parameters(), make_model(1).parameters(), strict=True)
        )
    assert moved > 0.1  # the proof is not vacuous: training changed the weights
