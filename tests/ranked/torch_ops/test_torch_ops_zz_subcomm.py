"""Independent trainings on sub-communicators: `init(comm=[ranks])` and `init(comm=mpi4py_comm)`.

Runs last (file name): it shuts the session's world-wide hvd down, runs each half of the ranks as its own job,
then initialises the whole world again for the session teardown.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch


def halves(n: int, r: int) -> list[int]:
    return list(range(n // 2)) if r < n // 2 else list(range(n // 2, n))


def test_init_on_a_list_of_ranks_and_on_a_communicator(hvd: ModuleType, comm: Any) -> None:
    n, r = hvd.size(), hvd.rank()
    mine = halves(n, r)
    hvd.shutdown()
    hvd.init(comm=mine)
    assert hvd.size() == len(mine) and hvd.rank() == mine.index(r)
    y = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="half")
    assert y.item() == float(sum(mine))
    hvd.shutdown()
    sub = comm.Split(0 if r < n // 2 else 1, r)
    hvd.init(comm=sub)
    g = hvd.allgather(torch.tensor([r]))
    assert g.tolist() == mine
    assert sub.allreduce(1) == len(mine), "the user's own communicator is untouched by ours"
    hvd.shutdown()
    sub.Free()
    hvd.init()
    assert hvd.size() == n
