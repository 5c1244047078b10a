"""Topology seen by each rank: world, local and cross groups, computed from rank and size."""

from __future__ import annotations

import os

import numpy as np
import pytest
from collective_cases import emulated_node_of

import hpcring
from hpcring.collective import Topology
from hpcring.errors import ConfigError


def test_world_local_cross_match_layout(world: Topology) -> None:
    n, r = hpcring.size(), hpcring.rank()
    nodes = [emulated_node_of(q, n) for q in range(n)]
    mine = nodes[r]
    peers = [q for q in range(n) if nodes[q] == mine]
    assert hpcring.local_size() == len(peers)
    assert hpcring.local_rank() == peers.index(r)
    same_local = [
        q for q in range(n) if [p for p in range(n) if nodes[p] == nodes[q]].index(q) == peers.index(r)
    ]
    assert hpcring.cross_size() == len(same_local)
    assert hpcring.cross_rank() == same_local.index(r)
    sizes = [nodes.count(k) for k in sorted(set(nodes))]
    assert hpcring.is_homogeneous() == (len(set(sizes)) == 1)
    assert world.node_sizes == tuple(sizes)


def test_init_is_idempotent_and_owns_a_duplicate(world: Topology) -> None:
    from mpi4py import MPI

    assert hpcring.init() is world
    assert world.comm != MPI.COMM_WORLD
    assert MPI.Comm.Compare(world.comm, MPI.COMM_WORLD) == MPI.CONGRUENT


def test_rank_environment_is_filled(world: Topology) -> None:
    assert os.environ["HPCRING_RANK"] == str(world.rank)
    assert os.environ["HPCRING_SIZE"] == str(world.size)
    assert os.environ["RANK"] == str(world.rank)
    assert os.environ["WORLD_SIZE"] == str(world.size)


def test_subset_of_even_ranks_reduces_among_members(world: Topology) -> None:
    evens = list(range(0, world.size, 2))
    if world.rank not in evens:
        with pytest.raises(ConfigError, match="not in the subset"):
            world.subset(evens)
        return
    sub = world.subset(evens)
    try:
        assert sub.size == len(evens)
        assert sub.rank == evens.index(world.rank)
        assert sum(sub.node_sizes) == sub.size
        x = np.full(5, world.rank, dtype=np.int64)
        for algorithm in ("native", "ring", "hierarchical"):
            y = hpcring.allreduce(x, algorithm=algorithm, topology=sub)
            assert (y == sum(evens)).all()
    finally:
        sub.free()


def test_subset_rejects_bad_ranks(world: Topology) -> None:
    with pytest.raises(ConfigError, match="out of range"):
        world.subset([0, world.size])
    with pytest.raises(ConfigError, match="distinct"):
        world.subset([0, 0])
