"""Elastic state as Horovod's, at 1, 2 and 4 ranks: what `sync()`, `restore()` and `ElasticSampler` give.

Every rank starts from a state of its own (values computed from its rank); `sync()` must leave every rank
with the root's committed values, keep them as the commit (so `restore()` returns to them), and repartition
an `ElasticSampler` for the world, at one rank as well (Horovod's `horovod/common/elastic.py` and
`horovod/torch/elastic/`).
"""

from __future__ import annotations

import math
import random
from types import ModuleType

import torch


def _model(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_sync_sends_the_roots_committed_values_and_keeps_them(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    model = _model(1.0 + hvd.rank())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1))
    state = hvd.elastic.TorchState(model, optimizer, batch=20 + hvd.rank(), epoch=10 + hvd.rank())
    state.batch = 99  # not committed: sync sends the committed value, as Horovod's ObjectState does
    state.sync()
    assert (state.batch, state.epoch) == (20, 10)
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == 0.1

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    state.batch, state.epoch = 21, 11
    state.restore()  # back to the root's state, on every rank: sync kept it as the commit
    assert (state.batch, state.epoch) == (20, 10)
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters())

    state.batch = 30 + hvd.rank()
    state.commit()
    state.batch = 0
    state.restore()
    assert state.batch == 30 + hvd.rank()  # a commit is each rank's own until the next sync
    state.sync()
    assert state.batch == 30


def _expected_share(n: int, processed: int, epoch: int, rank: int, size: int) -> list[int]:
    """Horovod's partition: the seeded shuffle of the epoch, less what the world processed, padded to a
    multiple of the size, every size-th index from the rank."""
    order = list(range(n))
    random.Random(epoch).shuffle(order)
    rest = order[processed:]
    total = math.ceil(len(rest) / size) * size
    rest += rest[: total - len(rest)]
    return rest[rank:total:size]


def test_sync_repartitions_the_sampler_at_every_size(horovod_torch: ModuleType) -> None:
    hvd = horovod_torch
    rank, size, batch = hvd.rank(), hvd.size(), 2
    dataset = list(range(8 * size))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.set_epoch(3)
    for i in range(rank + 1):  # each rank its own progress: the root's must win
        sampler.record_batch(i, batch)
    state.commit()
    state.sync()

    processed = batch * size  # the root recorded one batch of the world
    assert (sampler.epoch, sampler.processed_num) == (3, processed)
    share = _expected_share(len(dataset), processed, 3, rank, size)
    assert list(sampler) == share
    assert len(sampler) == len(share) == math.ceil((len(dataset) - processed) / size)
    everyone = hvd.allgather_object(list(sampler))
    unique = {i for part in everyone for i in part}
    assert len(unique) == len(dataset) - processed  # disjoint, and nothing processed comes back

    sampler.record_batch(1, batch)
    state.restore()  # the synced commit, repartitioned again
    assert list(sampler) == share
