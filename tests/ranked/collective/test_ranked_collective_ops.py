"""allgather, broadcast, alltoall, reducescatter and barrier on every rank, for every dtype."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import ALL_DTYPES, NUMERIC, expected_reduce, gen, np_dtype

import hpcring
from hpcring.collective import ReduceOp, Topology
from hpcring.collective.algorithms.chunks import part_sizes


def rows_of(rank: int, name: str, trailing: tuple[int, ...], rows: int) -> np.ndarray:
    """Rank's rows for the movement ops: values encode (rank, position) so misplacement shows."""
    count = rows * int(np.prod(trailing))
    vals = (np.arange(count) + 7 * rank) % 100
    if name == "bool":
        return (vals % 2 == 0).reshape(rows, *trailing)
    return vals.astype(np_dtype(name)).reshape(rows, *trailing)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_allgather_uneven_first_dimension(world: Topology, name: str) -> None:
    n, r = world.size, world.rank
    x = rows_of(r, name, (3,), r % 3)  # 0, 1, 2, 0, ... rows: includes empty contributions
    y = hpcring.allgather(x)
    want = np.concatenate([rows_of(q, name, (3,), q % 3) for q in range(n)])
    assert y.dtype == x.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)


def test_allgather_all_empty_and_1d(world: Topology) -> None:
    y = hpcring.allgather(np.zeros((0, 2), dtype=np.float32))
    assert y.shape == (0, 2)
    z = hpcring.allgather(np.array([world.rank], dtype=np.int64))
    np.testing.assert_array_equal(z, np.arange(world.size))


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_broadcast_from_every_root(world: Topology, name: str) -> None:
    for root in range(world.size):
        x = rows_of(world.rank, name, (2, 2), 5)
        assert hpcring.broadcast(x, root) is x
        np.testing.assert_array_equal(x, rows_of(root, name, (2, 2), 5))
    empty = np.zeros(0, dtype=np_dtype(name))
    assert hpcring.broadcast(empty, 0).size == 0


def test_broadcast_non_contiguous_writes_back(world: Topology) -> None:
    base = np.full((4, 4), world.rank, dtype=np.int32)
    hpcring.broadcast(base[:, 2], root=world.size - 1)
    assert (base[:, 2] == world.size - 1).all()
    assert (base[:, :2] == world.rank).all()


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_alltoall_with_splits(world: Topology, name: str) -> None:
    n, r = world.size, world.rank
    splits = [(r + j) % 3 for j in range(n)]  # rows rank r sends to rank j; zeros included
    x = rows_of(r, name, (2,), sum(splits))
    y, received = hpcring.alltoall(x, splits)
    assert received.dtype == np.int32
    want_splits = [(q + r) % 3 for q in range(n)]
    np.testing.assert_array_equal(received, want_splits)
    parts = []
    for q in range(n):
        q_splits = [(q + j) % 3 for j in range(n)]
        start = sum(q_splits[:r])
        parts.append(rows_of(q, name, (2,), sum(q_splits))[start : start + q_splits[r]])
    np.testing.assert_array_equal(y, np.concatenate(parts))


def test_alltoall_equal_split_default(world: Topology) -> None:
    n, r = world.size, world.rank
    x = np.arange(n * 2, dtype=np.float64) + 100 * r
    y, received = hpcring.alltoall(x)
    assert list(received) == [2] * n
    np.testing.assert_array_equal(
        y, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * q for q in range(n)])
    )


@pytest.mark.parametrize("name", NUMERIC)
def test_reducescatter_uneven_rows(world: Topology, name: str) -> None:
    n, r = world.size, world.rank
    for rows in (0, 1, n + 1, 3 * n + 2):
        for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            count = rows * 3
            full = expected_reduce(n, count, name, op).reshape(rows, 3)
            x = gen(r, count, name, op).reshape(rows, 3)
            y = hpcring.reducescatter(x, op)
            mine = part_sizes(rows, n)
            start = sum(mine[:r])
            assert y.shape == (mine[r], 3) and y.dtype == x.dtype
            want = full[start : start + mine[r]]
            if op is ReduceOp.AVERAGE and name in ("float16", "bfloat16", "float32", "float64"):
                np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-2)
            else:
                np.testing.assert_array_equal(y.astype(np.float64), want.astype(x.dtype).astype(np.float64))


def test_barrier(world: Topology) -> None:
    hpcring.barrier()
    hpcring.barrier(topology=world)
