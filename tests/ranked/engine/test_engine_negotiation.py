"""Negotiation, the response cache fast path, fusion, validation and join at the engine level (numpy only)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from engine_cases import submit

from hpcring.collective.topology import Topology
from hpcring.config import EngineSettings
from hpcring.engine import Engine, OpType, Request, Signature
from hpcring.errors import CollectiveError, CollectiveTimeoutError


def test_steady_state_uses_the_cache_not_the_table(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    names = [f"cache.{i}" for i in range(20)]
    for step in range(5):
        before = dict(engine.stats)
        handles = [
            submit(engine, OpType.ALLREDUCE, nm, np.full(8, float(r + i + step)))
            for i, nm in enumerate(names)
        ]
        for i, h in enumerate(handles):
            np.testing.assert_array_equal(h.wait(), np.full(8, float(n * (n - 1) // 2 + n * (i + step))))
        if step >= 1:  # announced once in full; afterwards only bits travel
            assert engine.stats["cache_hits"] - before["cache_hits"] == len(names)
            assert engine.stats["table_ready"] == before["table_ready"]


def test_submit_many_is_fused(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    before = engine.stats["fused"]
    reqs = [
        Request(
            Signature(f"fuse.{i}", OpType.ALLREDUCE, "float32", (16,), "average"),
            0,
            np.full(16, float(r), np.float32),
            np.empty(16, np.float32),
        )
        for i in range(30)
    ]
    engine.submit_many(reqs)
    for q in reqs:
        np.testing.assert_allclose(q.handle.wait(), np.full(16, (n - 1) / 2, np.float32))
    assert engine.stats["fused"] - before >= 30


def test_mismatched_operation_for_a_name(engine: Engine, world: Topology) -> None:
    if world.size == 1:
        pytest.skip("a mismatch needs a second rank")
    r = world.rank
    x = np.ones(4, np.float32)
    h = submit(engine, OpType.ALLGATHER if r == 1 else OpType.ALLREDUCE, "same.name", x)
    with pytest.raises(CollectiveError, match=r"Mismatched operations .*rank 1 has allgather"):
        h.wait()


def test_shape_mismatch_lists_every_rank(engine: Engine, world: Topology) -> None:
    if world.size == 1:
        pytest.skip("a mismatch needs a second rank")
    n, r = world.size, world.rank
    h = submit(engine, OpType.ALLREDUCE, "by.rank", np.ones(r + 1, np.float32))
    with pytest.raises(CollectiveError) as info:
        h.wait()
    for q in range(n):
        assert f"rank {q} has ({q + 1},)" in str(info.value)


def test_duplicate_name_in_flight(engine: Engine, world: Topology) -> None:
    h = submit(engine, OpType.ALLREDUCE, "twice", np.ones(2))
    with pytest.raises(ValueError, match="already in flight"):
        submit(engine, OpType.ALLREDUCE, "twice", np.ones(2))
    h.wait()
    with pytest.raises(ValueError, match="already in flight"):
        engine.submit_many(
            [Request(Signature("pair", OpType.BARRIER), 0), Request(Signature("pair", OpType.BARRIER), 0)]
        )


def test_join_neutral_values_for_min_max(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    if r == 0:  # rank 0 has no data at all: it joins at once
        assert submit(engine, OpType.JOIN, "join").wait() == n - 1
        return
    for step in range(r):
        x = np.array([r + 10.0, -(r + 10.0)])
        mn = submit(engine, OpType.ALLREDUCE, "j.min", x, reduce_op="min").wait()
        mx = submit(engine, OpType.ALLREDUCE, "j.max", x, reduce_op="max").wait()
        active = [q for q in range(1, n) if q > step]
        assert mn.tolist() == [min(active) + 10.0, -(max(active) + 10.0)]
        assert mx.tolist() == [max(active) + 10.0, -(min(active) + 10.0)]
    assert submit(engine, OpType.JOIN, "join").wait() == n - 1


def test_tiny_cache_evicts_and_stays_correct(world: Topology) -> None:
    n, r = world.size, world.rank
    e = Engine(world, EngineSettings(cache_capacity=3, fusion_threshold=64))
    try:
        for step in range(4):
            hs = [submit(e, OpType.ALLREDUCE, f"lru.{i}", np.full(4, float(r * i + step))) for i in range(7)]
            for i, h in enumerate(hs):
                np.testing.assert_array_equal(h.wait(), np.full(4, float(i * n * (n - 1) // 2 + n * step)))
        assert e.stats["batches"] > 7  # a 64-byte threshold splits what default settings would fuse
    finally:
        e.shutdown()


def test_cached_request_waiting_long_is_renegotiated(world: Topology) -> None:
    """A cached request that waits past half the stall time moves to the table (so stalls can be reported)."""
    if world.size == 1:
        pytest.skip("a request waits only for a peer")
    n, r = world.size, world.rank
    e = Engine(world, EngineSettings(stall_check_time_s=0.4))
    try:
        for step in range(3):
            if step == 2 and r == n - 1:
                time.sleep(1.0)
            h = submit(e, OpType.ALLREDUCE, "slow", np.full(3, float(r)))
            np.testing.assert_array_equal(h.wait(), np.full(3, float(n * (n - 1) // 2)))
        assert e.stats["table_ready"] >= 2  # first announcement and the renegotiated one
    finally:
        e.shutdown()


def test_other_collectives_through_the_engine(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    g = submit(engine, OpType.ALLGATHER, "ag", np.full((r + 1, 2), r, np.int32)).wait()
    assert g.shape == (n * (n + 1) // 2, 2)
    b = np.full(3, float(r))
    assert submit(engine, OpType.BROADCAST, "bc", b, out=b, root=n - 1).wait() is b
    assert b.tolist() == [float(n - 1)] * 3
    out, received = submit(engine, OpType.ALLTOALL, "a2a", np.arange(n, dtype=np.float64) + 10 * r).wait()
    assert np.asarray(out).tolist() == [10.0 * q + r for q in range(n)] and list(received) == [1] * n
    rs = submit(engine, OpType.REDUCESCATTER, "rs", np.ones((2 * n, 2))).wait()
    assert rs.tolist() == [[float(n)] * 2] * 2
    assert submit(engine, OpType.BARRIER, "b").wait() is None


def test_tune_applies_rank_zeros_values_on_every_rank(engine: Engine, world: Topology) -> None:
    """Engine.tune (the autotuner's hook): the global set's rank 0 decides, every rank applies the values at
    the same point of the op sequence, and the next fused batches follow the new threshold everywhere."""
    old = (engine.settings.fusion_threshold, engine.settings.cycle_time_ms)
    mine = (128, 2.5) if world.rank == 0 else (None, None)
    assert engine.tune(*mine).wait() == (128, 2.5)
    assert (engine.settings.fusion_threshold, engine.settings.cycle_time_ms) == (128, 2.5)
    batches, fused = engine.stats["batches"], engine.stats["fused"]
    reqs = [
        Request(
            Signature(f"tuned.{i}", OpType.ALLREDUCE, "float32", (16,), "sum"),  # 64 bytes: two per batch
            0,
            np.full(16, float(world.rank), np.float32),
            np.empty(16, np.float32),
        )
        for i in range(8)
    ]
    engine.submit_many(reqs)
    for q in reqs:
        np.testing.assert_array_equal(q.handle.wait(), np.full(16, world.size * (world.size - 1) / 2))
    assert engine.stats["batches"] - batches == 4
    assert engine.stats["fused"] - fused == 8
    assert engine.tune(*old).wait() == old  # every rank passes the same values: the same result
    with pytest.raises(ValueError, match="fusion_threshold"):
        engine.tune(-1)


def test_inline_a_lone_request_runs_on_the_waiting_thread(engine: Engine, world: Topology) -> None:
    """caller_cycles.py: a lone host request on an idle engine is cycled by the thread that waits for it;
    results are the same, and ranks that wait inline and ranks that leave it to their engine thread pair
    up."""
    n, r = world.size, world.rank
    before = engine.stats["inline"]
    for i in range(40):
        h = submit(engine, OpType.ALLREDUCE, "inline.lone", np.full(3, float(r + i)))
        if r % 2 == 0 or i % 3 == 0:  # odd ranks mostly leave it to the engine thread
            engine.run_inline(h)
        np.testing.assert_array_equal(h.wait(), np.full(3, float(n * (n - 1) // 2 + n * i)))
    assert engine.stats["inline"] - before >= (20 if r % 2 == 0 else 5)


def test_a_lone_cached_allreduce_runs_its_plain_cycles_in_the_core(engine: Engine, world: Topology) -> None:
    """lone_cycle.py: once its name is cached, a lone small host allreduce waited for inline runs its cycles
    in the compiled core (MPI_Iallreduce of the bit words, MPI_Allreduce), paired with peers that run theirs
    in C or in Python; in place and out of place, with AVERAGE's and a postscale's factor."""
    from hpcring.engine import core

    n, r = world.size, world.rank
    before = engine.stats["lone"]
    for i in range(30):
        x = np.full(5, float(r + i), np.float32)
        out = x if i % 2 else None  # in place on odd steps
        h = submit(engine, OpType.ALLREDUCE, "lone.engine", x, out=out, reduce_op="average", postscale=4.0)
        if r % 2 == 0 or i % 3 == 0:  # odd ranks mostly leave it to the engine thread
            engine.run_inline(h)
        want = np.float32((n - 1) / 2 + i) * np.float32(4.0)
        np.testing.assert_array_equal(h.wait(), np.full(5, want, np.float32))
    plain = core.kind() == "compiled" and engine._state.timeline is None and len(engine._state.sets) == 1
    ran = engine.stats["lone"] - before
    assert ran > 0 if plain and r % 2 == 0 else ran >= 0
    if core.kind() == "python":
        assert ran == 0


def test_inline_declines_when_other_work_is_in_flight(engine: Engine, world: Topology) -> None:
    """Two requests in flight: the waiter does not take over (it blocks as before) and both complete."""
    n, r = world.size, world.rank
    before = engine.stats["inline"]
    first = submit(engine, OpType.ALLREDUCE, "inline.busy.0", np.full(2, float(r)))
    second = submit(engine, OpType.ALLREDUCE, "inline.busy.1", np.full(2, 1.0))
    engine.run_inline(first)
    if not first.done():  # declined: two requests were in flight
        assert engine.stats["inline"] == before
    np.testing.assert_array_equal(first.wait(), np.full(2, float(n * (n - 1) // 2)))
    np.testing.assert_array_equal(second.wait(), np.full(2, float(n)))


def test_a_peer_shutting_down_ends_an_inline_wait(world: Topology) -> None:
    """A rank waiting inline when its peers shut down gets an error, not a hang: the inline cycle sees the
    shutdown flag and hands the stop to the engine thread, which fails the handle."""
    if world.size == 1:
        pytest.skip("needs a peer")
    e = Engine(world, EngineSettings())
    try:
        if world.rank == 0:
            h = submit(e, OpType.ALLREDUCE, "inline.orphan", np.ones(2))
            e.run_inline(h)
            with pytest.raises(CollectiveError, match="shut down"):
                h.wait(timeout=60)
            assert not e.running or e._stopped.wait(30)
        else:
            time.sleep(0.2)  # let rank 0 start waiting inline
            e.shutdown("rank shuts down on purpose")
    finally:
        e.shutdown()


def test_after_the_collective_timeout_fired_a_stopping_engine_raises_its_words(world: Topology) -> None:
    """Once the watchdog fired (it waits GRACE_S before it fails pending requests), an engine stopped
    meanwhile by a peer's exit fails them with the timeout's own error and words, not with its shutdown
    wording: the user sees one message whichever thread gets there first."""
    if world.size == 1:
        pytest.skip("needs a peer")
    e = Engine(world, EngineSettings())
    try:
        if world.rank == 0:
            words = "hpcring: collective timeout on rank 0 (host h): allreduce 'fired' waited for rank 1"
            e._watchdog.fired = words  # what the watchdog's expiry sets first, before its grace
            h = submit(e, OpType.ALLREDUCE, "fired", np.ones(2))
            with pytest.raises(CollectiveTimeoutError) as raised:
                h.wait(timeout=60)
            assert str(raised.value) == words
        else:
            time.sleep(0.5)  # rank 0's request is in flight
            e.shutdown("the rank the timeout named ends")
    finally:
        e.shutdown()
