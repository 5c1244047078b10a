"""The shared-memory allreduce (`shm`) on every rank: rounds bigger than one slot, every op on 16-bit floats,
the fallback to the ring where the ranks cannot share memory, and no file left behind. On groups that span
nodes (emulated) `shm` is refused, checked in test_ranked_collective_allreduce.py."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from collective_cases import gen
from mpi4py import MPI
from test_ranked_collective_allreduce import ops_for, reduce_and_check

import hpcring
from hpcring.collective import ReduceOp, Topology
from hpcring.collective.algorithms import shm
from hpcring.collective.selection import choose_algorithm


@pytest.fixture()
def one_node(world: Topology) -> Topology:
    if world.size < 2 or len(world.node_sizes) > 1:
        pytest.skip("shared memory needs 2 or more ranks on one node")
    return world


@pytest.mark.parametrize("name", ("float32", "float16", "bfloat16", "int64", "bool"))
def test_rounds_bigger_than_a_slot(one_node: Topology, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 MiB slot and 2-3 MiB buffers: several rounds, the last one short; every op, both ways."""
    monkeypatch.setenv(shm.SLOT_ENV, str(1 << 20))
    count = (5 << 20) // (2 * np.dtype(gen(0, 1, name).dtype).itemsize) + 7
    for i, op in enumerate(ops_for(name)):
        reduce_and_check(one_node, count, name, op, "shm", i % 2 == 1, f"{name} {op.name} in rounds")


def test_auto_takes_shm_from_the_rule(one_node: Topology) -> None:
    world = one_node
    """What `auto` picks here is what the pure rule says for this node: the call agrees with it."""
    count = (2 << 20) // 4
    picked = choose_algorithm(count * 4, native_exact=True, local_size=world.local_size, cross_size=1)
    assert picked == ("shm" if world.size >= 4 else "ring")
    x = np.full(count, world.rank + 1, np.float32)
    y = hpcring.allreduce(x, ReduceOp.AVERAGE)
    np.testing.assert_allclose(y, np.full(count, (world.size + 1) / 2))


def test_falls_back_to_the_ring_where_memory_cannot_be_shared(
    one_node: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No usable directory on any rank: one RuntimeWarning naming why, the ring's result, and the group stays
    on the ring (no new attempt, no new warning)."""
    monkeypatch.setenv(shm.DIR_ENV, "/nonexistent/hpcring-shm")
    topo = Topology.create(MPI.COMM_WORLD)
    try:
        x = np.full(4096, topo.rank + 1.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = hpcring.allreduce(x, topology=topo, algorithm="shm")
            z = hpcring.allreduce(x, topology=topo, algorithm="shm")
        np.testing.assert_array_equal(y, np.full(4096, topo.size * (topo.size + 1) / 2))
        np.testing.assert_array_equal(z, y)
        seg = topo.shared_segment()
        assert seg is not None and seg.unavailable == "/nonexistent/hpcring-shm does not exist"
        texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(texts) <= 1 and all("/nonexistent/hpcring-shm does not exist" in t for t in texts)
    finally:
        topo.free()


def test_no_segment_file_is_left_behind(one_node: Topology) -> None:
    """The segment is unlinked as soon as every rank has mapped it: after use, no file of this job exists,
    though the memory stays mapped and usable."""
    topo = Topology.create(MPI.COMM_WORLD)
    try:
        x = np.ones(300_000, np.float32)
        hpcring.allreduce(x, out=x, topology=topo, algorithm="shm")
        assert (x == topo.size).all()
        leader = topo.comm.bcast(os.getpid(), root=0)
        leftovers = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"hpcring-{leader}-")]
        topo.comm.Barrier()
        assert leftovers == []
        hpcring.allreduce(x, out=x, topology=topo, algorithm="shm")
        assert (x == topo.size**2).all()
    finally:
        topo.free()


def test_a_group_of_one_rank() -> None:
    """The segment and a round on MPI_COMM_SELF (every launch, any size): the round still fills, reduces
    (a copy), finishes and drains, and a second, bigger ensure() grows the segment."""
    seg = shm.SharedSegment(MPI.COMM_SELF)
    try:
        assert seg.ensure(1000) and seg.slot_bytes >= 1000
        x = np.arange(250, dtype=np.float32)
        out = np.empty_like(x)
        shm.shm_round(
            seg,
            x.size,
            x.dtype,
            ReduceOp.SUM,
            lambda slot: np.copyto(slot, x),
            lambda result: np.copyto(out, result),
            lambda part: np.multiply(part, 2, out=part),
        )
        np.testing.assert_array_equal(out, 2 * x)
        small = seg.slot_bytes
        kept = seg.view(0, 4, np.dtype(np.float32))  # a view still alive (as in a traceback) while it grows
        assert seg.ensure(3 * small) and seg.slot_bytes >= 3 * small
        assert seg.unavailable is None
        np.testing.assert_array_equal(kept, x[:4])  # the old mapping lives on until its last view is freed
    finally:
        seg.close()


@pytest.mark.parametrize("count", (1, 3, 1031, (3 << 20) // 4 + 5))
def test_contiguous_round_gives_the_general_rounds_bits(
    one_node: Topology, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shm_allreduce` (only the other ranks' parts through the slot, this rank's own part read where it
    lies) against `shm_round` (everything through the slot) on the same random float32 inputs: the same
    bits in place and out of place, the finish applied once, the input untouched out of place. Counts
    smaller than the group leave some ranks without a part; the largest takes several 1 MiB rounds."""
    monkeypatch.setenv(shm.SLOT_ENV, str(1 << 20))
    seg = shm.SharedSegment(one_node.comm)
    try:
        x = np.random.default_rng(one_node.rank).standard_normal(count).astype(np.float32)
        halve = lambda part: np.multiply(part, np.float32(0.5), out=part)  # noqa: E731
        want = np.empty_like(x)
        step = (1 << 20) // 4
        assert seg.ensure(min(count, step) * 4)
        for lo in range(0, count, step):
            piece, out = x[lo : lo + step], want[lo : lo + step]
            shm.shm_round(
                seg,
                piece.size,
                x.dtype,
                ReduceOp.SUM,
                lambda slot, piece=piece: np.copyto(slot, piece),
                lambda result, out=out: np.copyto(out, result),
                halve,
            )
        before = x.copy()
        got = np.empty_like(x)
        assert shm.shm_allreduce(seg, x, got, ReduceOp.SUM, finish=halve)
        np.testing.assert_array_equal(x, before)
        np.testing.assert_array_equal(got, want)
        assert shm.shm_allreduce(seg, x, x, ReduceOp.SUM, finish=halve)
        np.testing.assert_array_equal(x, want)
    finally:
        seg.close()
