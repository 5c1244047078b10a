"""Horovod's rank rule for Adasum: a power-of-two world (equal nodes, a power-of-two number of them, on the
process-group route). Elsewhere the call is refused on every rank, before anything is queued, with the
allowed sizes named; the job goes on."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from adasum_cases import node_aware


def test_the_rank_rule_is_horovods(hvd: ModuleType) -> None:
    n = hvd.size()
    counted = n // hvd.local_size() if node_aware() else n
    if counted & (counted - 1) == 0:
        got = hvd.allreduce(torch.ones(4, dtype=torch.float64), op=hvd.Adasum, name="rule")
        assert torch.equal(got, torch.ones(4, dtype=torch.float64))  # equal vectors: their average
        return
    what = "nodes" if node_aware() else "ranks"
    with pytest.raises(NotImplementedError, match=rf"power-of-two number of {what}.*allowed: 1, 2, 4, 8"):
        hvd.allreduce(torch.ones(4), op=hvd.Adasum, name="rule")
    with pytest.raises(ValueError, match=rf"power-of-two number of {what}"):
        hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), op=hvd.Adasum)
    # The job is intact: a Sum still runs on every rank.
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [n, n]
