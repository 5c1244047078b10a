"""Index arithmetic of the ring and hierarchical algorithms, checked by replaying the schedules in numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcring.collective.algorithms.chunks import (
    bounds,
    chunk_ranges,
    offsets,
    owned_shards,
    part_sizes,
    ring_gather_segment,
    ring_reduce_segment,
    shard_owner,
)
from hpcring.collective.algorithms.hierarchical import local_counts


def test_part_sizes_give_extra_rows_to_low_ranks() -> None:
    assert part_sizes(10, 4) == [3, 3, 2, 2]
    assert part_sizes(3, 5) == [1, 1, 1, 0, 0]
    assert part_sizes(0, 3) == [0, 0, 0]
    assert bounds(10, 4) == [0, 3, 6, 8, 10]
    assert offsets([2, 0, 5]) == [0, 2, 2, 7]
    with pytest.raises(ValueError):
        part_sizes(4, 0)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_part_sizes_cover_count_and_differ_by_at_most_one(count: int, n: int) -> None:
    sizes = part_sizes(count, n)
    assert sum(sizes) == count and len(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 9), st.integers(1, 700))
def test_ring_schedule_replayed_reduces_and_gathers_everything(count: int, n: int, chunk: int) -> None:
    """Simulate the ring: every message a rank sends is exactly what its right neighbour expects to receive,
    and after reduce-scatter + allgather every rank holds the full sum."""
    rng = np.random.default_rng(count * 31 + n)
    inputs = [rng.integers(0, 100, count) for _ in range(n)]
    seg = bounds(count, n)
    partial = [x.copy() for x in inputs]
    for step in range(n - 1):
        sent = {}
        for r in range(n):
            s, _ = ring_reduce_segment(r, n, step)
            sent[r] = (s, [partial[r][a:b].copy() for a, b in chunk_ranges(seg[s], seg[s + 1], chunk)])
        for r in range(n):
            s_left, chunks = sent[(r - 1) % n]
            _, recv = ring_reduce_segment(r, n, step)
            assert s_left == recv
            for (a, b), data in zip(chunk_ranges(seg[recv], seg[recv + 1], chunk), chunks, strict=True):
                partial[r][a:b] = inputs[r][a:b] + data
    total = np.sum(inputs, axis=0)
    for r in range(n):
        np.testing.assert_array_equal(partial[r][seg[r] : seg[r + 1]], total[seg[r] : seg[r + 1]])
    final = [
        np.where(np.isin(np.arange(count), np.arange(seg[r], seg[r + 1])), partial[r], -1) for r in range(n)
    ]
    for step in range(n - 1):
        sent = {r: ring_gather_segment(r, n, step)[0] for r in range(n)}
        snapshot = [f.copy() for f in final]
        for r in range(n):
            _, recv = ring_gather_segment(r, n, step)
            assert sent[(r - 1) % n] == recv
            final[r][seg[recv] : seg[recv + 1]] = snapshot[(r - 1) % n][seg[recv] : seg[recv + 1]]
    for r in range(n):
        np.testing.assert_array_equal(final[r], total)


def test_chunk_ranges() -> None:
    assert chunk_ranges(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_ranges(5, 5, 4) == [(5, 5)]
    assert chunk_ranges(3, 5, 0) == [(3, 4), (4, 5)]


@given(st.integers(1, 16), st.data())
def test_shard_ownership_is_contiguous_and_inverse(shards: int, data: st.DataObject) -> None:
    local_size = data.draw(st.integers(1, shards))
    runs = [owned_shards(lr, shards, local_size) for lr in range(local_size)]
    assert [j for run in runs for j in run] == list(range(shards))  # contiguous, in order, each shard once
    assert all(len(run) >= 1 for run in runs)
    for lr, run in enumerate(runs):
        assert all(shard_owner(j, shards, local_size) == lr for j in run)


def test_local_counts_for_unequal_nodes() -> None:
    # 3 shards of 10 elements = [4, 3, 3]; a node of 2 ranks: local rank 0 owns shards 0-1, rank 1 owns 2.
    assert local_counts(10, 3, 2) == [7, 3]
    assert local_counts(10, 3, 3) == [4, 3, 3]
    assert local_counts(10, 3, 1) == [10]
    assert local_counts(0, 4, 2) == [0, 0]
