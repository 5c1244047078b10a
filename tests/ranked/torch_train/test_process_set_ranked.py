"""DistributedOptimizer and the broadcast helpers restricted to a process set (ranks 0 and the last rank).

Members average among themselves; a rank outside the set steps on its own gradient, as in Horovod, and never
joins the members' collectives. Every rank registers and removes the set (both are collective).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from torch_train_helpers import make_model, params_sum_loss


@pytest.fixture
def pair(hvd: ModuleType) -> Iterator[Any]:
    if hvd.size() == 2:  # ranks [0, 1] are the global set, which cannot be registered twice
        yield hvd.global_process_set
        return
    ps = hvd.add_process_set([0, hvd.size() - 1])
    yield ps
    hvd.remove_process_set(ps)


def test_optimizer_averages_within_the_set_only(hvd: ModuleType, pair: Any) -> None:
    model = make_model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        process_set=pair,
    )
    before = [p.detach().clone() for p in model.parameters()]
    params_sum_loss(model, hvd.rank() + 1).backward()
    opt.step()
    expected = (1 + hvd.size()) / 2 if pair.included() else hvd.rank() + 1  # mean of ranks 0 and size-1
    for b, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), b - expected)


def test_broadcast_helpers_within_the_set(hvd: ModuleType, pair: Any) -> None:
    if not pair.included():
        return
    last = hvd.size() - 1
    model = make_model(seed=hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=last, process_set=pair)
    for p, q in zip(model.parameters(), make_model(seed=last).parameters(), strict=True):
        assert torch.equal(p, q)
    opt = torch.optim.Adam(model.parameters(), lr=0.1 * (hvd.rank() + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=last, process_set=pair)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (last + 1))
    got = hvd.broadcast_object({"from": hvd.rank()}, root_rank=last, process_set=pair)
    assert got == {"from": last}
    assert hvd.allgather_object(hvd.rank(), process_set=pair) == [0, last]
