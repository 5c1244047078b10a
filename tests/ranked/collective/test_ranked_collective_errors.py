"""Bad input raises an hpcring error on every rank instead of hanging; each rank checks its own exception."""

from __future__ import annotations

import numpy as np
import pytest

import hpcring
from hpcring.collective import ReduceOp, Topology
from hpcring.errors import CollectiveError, ConfigError


def test_unknown_op_and_algorithm_everywhere(world: Topology) -> None:
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ConfigError, match="allowed: 'SUM', 'AVERAGE'"):
        hpcring.allreduce(x, op="median")
    with pytest.raises(ConfigError, match="allowed: 'auto', 'native', 'ring', 'hierarchical' or 'shm'"):
        hpcring.allreduce(x, algorithm="tree")


def test_unknown_algorithm_from_environment(world: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCRING_ALLREDUCE_ALGORITHM", "butterfly")
    with pytest.raises(ConfigError, match="HPCRING_ALLREDUCE_ALGORITHM"):
        hpcring.allreduce(np.ones(2))


def test_unsupported_dtype_lists_supported(world: Topology) -> None:
    with pytest.raises(ConfigError, match="unsupported dtype 'complex64'; supported: 'uint8'"):
        hpcring.allreduce(np.ones(3, dtype=np.complex64))
    with pytest.raises(ConfigError, match="op SUM is not defined for bool"):
        hpcring.allreduce(np.ones(3, dtype=bool))


def test_bad_root(world: Topology) -> None:
    with pytest.raises(ConfigError, match=f"root {world.size} is out of range; allowed: an integer from 0"):
        hpcring.broadcast(np.ones(3), root=world.size)


def test_reducescatter_rejects_max(world: Topology) -> None:
    with pytest.raises(ConfigError, match="op MAX is not supported; allowed: 'SUM' or 'AVERAGE'"):
        hpcring.reducescatter(np.ones(4), ReduceOp.MAX)


def test_bad_splits_on_one_rank_fail_everywhere(world: Topology) -> None:
    n, r = world.size, world.rank
    bad_rank = n - 1
    x = np.zeros((n, 2))
    cases = {
        "wrong length": ([1] * (n + 1), "splits has"),
        "negative": ([-1] + [1] * (n - 2) + [2] if n > 1 else [-1], "negative"),
        "bad sum": ([2] * n, "must sum to dimension 0"),
    }
    for label, (bad, message) in cases.items():
        splits = bad if r == bad_rank else [1] * n
        if r == bad_rank:
            with pytest.raises(ConfigError, match=message):
                hpcring.alltoall(x, splits)
        else:
            with pytest.raises(CollectiveError, match=f"invalid arguments on rank {bad_rank}") as info:
                hpcring.alltoall(x, splits)
            assert message.split()[0] in str(info.value), label
        hpcring.barrier()  # every rank got here: nobody hung


def test_mismatched_dtype_names_ranks(world: Topology) -> None:
    dtype = np.float64 if world.rank == 0 else np.float32
    if world.size == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(
        CollectiveError, match=r"dtype differs across ranks: 'float64' on rank 0; 'float32' on rank"
    ):
        hpcring.allreduce(np.ones(4, dtype=dtype))


def test_mismatched_shape_names_ranks(world: Topology) -> None:
    if world.size == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(CollectiveError, match="shape differs across ranks"):
        hpcring.allreduce(np.ones(4 + world.rank % 2))
    with pytest.raises(CollectiveError, match="trailing dimensions differs across ranks"):
        hpcring.allgather(np.ones((2, 1 + world.rank % 2)))
    with pytest.raises(CollectiveError, match="root differs across ranks"):
        hpcring.broadcast(np.ones(2), root=world.rank % 2)


def test_mismatched_algorithm_and_op(world: Topology) -> None:
    if world.size == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(CollectiveError, match="algorithm differs"):
        hpcring.allreduce(np.ones(4), algorithm="ring" if world.rank == 0 else "native")
    with pytest.raises(CollectiveError, match="op differs"):
        hpcring.allreduce(np.ones(4), op="max" if world.rank == 0 else "min")


def test_not_an_array(world: Topology) -> None:
    with pytest.raises(
        ConfigError, match=r"expected a numpy\.ndarray or a CPU torch\.Tensor, got builtins\.list"
    ):
        hpcring.allreduce([1, 2, 3])


def test_out_must_match(world: Topology) -> None:
    with pytest.raises(ConfigError, match="out has shape"):
        hpcring.allreduce(np.ones(4), out=np.empty(5))
