"""Functions the Spark tests run on the executors (importable there by name: this folder is on their path)."""

from __future__ import annotations

from typing import Any


def layout_and_sum() -> tuple[int, int, int, int, float]:
    """This rank's place in the world and an allreduce (sum) of rank + 1 across it."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), float(total.item())


def scaled(factor: int, *, offset: int = 0) -> dict[str, Any]:
    """f(rank, size) with the args and kwargs that `run` passes, without torch."""
    import hpcring.torch as hvd

    hvd.init()
    return {"rank": hvd.rank(), "value": factor * hvd.rank() + offset * hvd.size()}


def raise_on(bad_rank: int) -> None:
    """`bad_rank` raises while the others wait for it in an allreduce (they would hang without the error)."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    if hvd.rank() == bad_rank:
        raise ValueError(f"boom from rank {bad_rank}")
    hvd.allreduce(torch.ones(1), op=hvd.Sum)


def exit_on(bad_rank: int) -> None:
    """`bad_rank`'s worker process dies outright (no exception to report) while the others wait for it."""
    import os

    import torch

    import hpcring.torch as hvd

    hvd.init()
    if hvd.rank() == bad_rank:
        os._exit(3)
    hvd.allreduce(torch.ones(1), op=hvd.Sum)
