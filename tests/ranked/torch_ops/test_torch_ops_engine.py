"""Engine behaviour seen through `hpcring.torch`: submit order, join, process sets, timeline, lifecycle, and a
user's own mpi4py traffic next to ours."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch


def test_basics(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    assert hvd.is_initialized() and 0 <= r < n
    assert 0 <= hvd.local_rank() < hvd.local_size() <= n
    assert 0 <= hvd.cross_rank() < hvd.cross_size() <= n
    assert hvd.local_size() * hvd.cross_size() == n or not hvd.is_homogeneous()
    assert hvd.mpi_built() and hvd.mpi_enabled() and hvd.mpi_threads_supported()
    assert hvd.gloo_built() is False and hvd.ccl_built() is False and hvd.cuda_built() is False
    assert hvd.rocm_built() is False and hvd.nccl_built() is False
    assert int(os.environ["RANK"]) == r and int(os.environ["WORLD_SIZE"]) == n
    hvd.init()  # idempotent
    assert hvd.size() == n
    from hpcring import malloc_policy  # init() fixed the allocator's thresholds, unless told not to

    skip = malloc_policy.reason_to_skip(os.environ)
    assert malloc_policy.state() == (f"left as it is: {skip}" if skip else malloc_policy.tune())
    assert skip is not None or (malloc_policy.state() or "").startswith("tuned:")


def test_different_submit_order_across_ranks(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    names = [f"order.{i}" for i in range(12)]
    order = names[r:] + names[:r]  # every rank starts somewhere else
    if r % 2:
        order.reverse()
    handles = {
        nm: hvd.allreduce_async(torch.full((5,), float(i + r)), name=nm, op=hvd.Sum)
        for nm, i in ((nm, names.index(nm)) for nm in order)
    }
    for i, nm in enumerate(names):
        assert hvd.synchronize(handles[nm]).tolist() == [float(n * i + n * (n - 1) // 2)] * 5


def test_join_with_uneven_data(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    steps = r + 1  # rank r has r + 1 batches: later ranks keep going after the early ones joined
    for s in range(steps):
        y = hvd.allreduce(torch.full((3,), 1.0), name="join.grad", op=hvd.Average)
        active = n - s  # ranks r >= s are still submitting at step s; joined ranks add zeros
        assert torch.allclose(y, torch.full((3,), active / n)), (s, y)
        hvd.barrier()  # as in Horovod, a barrier proceeds without the joined ranks (they wait in join)
    last = hvd.join()
    assert last == n - 1
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # normal service after everyone joined


def test_join_refuses_every_op_but_allreduce_and_barrier(hvd: ModuleType) -> None:
    """As Horovod's controller ("... is not supported with Join at this time"): while a rank has joined,
    allgather, broadcast, alltoall and reducescatter fail on every rank that submitted them, cached (the fast
    path: before, a cached alltoall hung) or not; allreduce and barrier go on. Rank 0 joins."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a rank that joins while others submit")
    x = torch.full((n,), float(r + 1))
    ops = {
        "allgather": lambda name: hvd.allgather(x, name=name),
        "broadcast": lambda name: hvd.broadcast(x, n - 1, name=name),
        "alltoall": lambda name: hvd.alltoall(x, name=name),
        "reducescatter": lambda name: hvd.reducescatter(x, op=hvd.Sum, name=name),
    }
    for _ in range(2):  # executed twice: every signature is in the response cache
        for op, call in ops.items():
            call(f"join.cached.{op}")
    if r == 0:
        _joins_last_among(hvd, range(1, n))
        return
    for op, call in ops.items():
        for name in (f"join.cached.{op}", f"join.new.{op}"):
            refused = f"{op} is not supported with join, and ranks 0 have joined"
            with pytest.raises(hvd.HorovodInternalError, match=refused):
                call(name)
    hvd.barrier()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="join.still").item() == n - 1
    _joins_last_among(hvd, range(1, n))


def test_each_rank_joining_first_in_turn_with_unnamed_refused_ops(hvd: ModuleType) -> None:
    """Horovod's join loop (test_horovod_join_allgather): each rank in turn joins first while the others
    call an unnamed allgather, which must fail, then join. The rank that joined first has called fewer
    allgathers, so from 3 ranks on the others' unnamed ops carry different numbers: a refused op fails at once
    instead of waiting for all copies to meet (it hung)."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a rank that joins while others submit")
    for first in range(n):
        if r != first:
            with pytest.raises(hvd.HorovodInternalError, match="allgather is not supported with join"):
                hvd.allgather(torch.ones(2, 3))
        last = hvd.join()
        assert last != first and hvd.allgather_object(last) == [last] * n


def _joins_last_among(hvd: ModuleType, ranks: Iterable[int]) -> None:
    """join() returns the rank that joined last: one of `ranks` (which join after their last op, in whatever
    order they get there: those joining in the same cycle count in rank order), the same on every rank."""
    last = hvd.join()
    assert last in set(ranks) and hvd.allgather_object(last) == [last] * hvd.size()


@pytest.mark.parametrize("op", ["min", "max", "product"])
def test_joined_ranks_contribute_neutral_values_unscaled(hvd: ModuleType, op: str) -> None:
    """A joined rank's identity for Min/Max/Product (bfloat16 included: it hung) is not prescaled: a scaled
    identity (2 x 1 for Product, -1 x the largest value for Min) would change the result."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a rank that joins while others submit")
    hvd_op = getattr(hvd, op.capitalize())
    active = list(range(1, n))
    if r == 0:
        _joins_last_among(hvd, active)
        return
    for dtype in (torch.float32, torch.bfloat16):
        for pre in (1.0, 2.0, -1.0):
            x = torch.tensor([3.0, 5.0]).to(dtype) * r
            y = hvd.allreduce(x, op=hvd_op, prescale_factor=pre, name=f"join.neutral.{op}.{dtype}.{pre}")
            scaled = torch.stack([torch.tensor([3.0, 5.0]) * q * pre for q in active])
            want = {"min": scaled.min(0).values, "max": scaled.max(0).values, "product": scaled.prod(0)}[op]
            assert torch.allclose(y.float(), want.to(dtype).float(), rtol=1e-2), (op, dtype, pre, y, want)
    _joins_last_among(hvd, active)


def test_mismatched_process_set_changes_fail_on_every_rank(hvd: ModuleType) -> None:
    """Ranks adding different sets meet under one name and get the mismatch (before: a hang)."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched add_process_set"):
        hvd.add_process_set([r])


def test_settings_that_must_agree_are_checked_at_init(hvd: ModuleType) -> None:
    """A fusion threshold set on one rank only would plan different batches (a hang later): init() refuses it
    on every rank, naming the variable and each rank's value, and starts nothing."""
    from hpcring.errors import ConfigError

    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks to disagree")
    hvd.shutdown()
    old = os.environ.get("HPCRING_FUSION_THRESHOLD")
    try:
        if r == 0:
            os.environ["HPCRING_FUSION_THRESHOLD"] = "1048576"
        differs = r"HPCRING_FUSION_THRESHOLD differs between ranks .rank 0: 1048576"
        with pytest.raises(ConfigError, match=differs):
            hvd.init()
        assert not hvd.is_initialized()
    finally:
        if old is None:
            os.environ.pop("HPCRING_FUSION_THRESHOLD", None)
        else:
            os.environ["HPCRING_FUSION_THRESHOLD"] = old
        hvd.init()


def test_dynamic_process_sets(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([q for q in range(n) if q % 2 == 1]))
    mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
    assert mine.included() and not other.included() and mine.rank() == mine.ranks.index(r)
    with pytest.raises(ValueError, match="not part of"):
        other.rank()  # Horovod's answer outside the set
    y = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, process_set=mine, name="ps")
    assert y.tolist() == [float(sum(mine.ranks))] * 2
    g = hvd.allgather(torch.tensor([r]), process_set=mine)
    assert g.tolist() == mine.ranks
    b = hvd.broadcast(torch.tensor([float(r)]), root_rank=mine.ranks[-1], process_set=mine)
    assert b.item() == mine.ranks[-1]
    rs = hvd.reducescatter(torch.ones(2 * mine.size()), op=hvd.Sum, process_set=mine)
    assert rs.tolist() == [float(mine.size())] * 2
    hvd.barrier(process_set=mine)
    with pytest.raises(ValueError, match="not a member"):
        hvd.allreduce(torch.ones(1), process_set=other)
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(list(mine.ranks))
    assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)
    assert mine.process_set_id is None and hvd.remove_process_set(mine) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False  # never removed, as in Horovod
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=mine)


def test_user_mpi4py_calls_interleaved(hvd: ModuleType, comm: Any) -> None:
    """The user's COMM_WORLD traffic, from the main thread, runs while the engine works on its own comms."""
    n, r = hvd.size(), hvd.rank()
    import numpy as np
    from mpi4py import MPI

    for step in range(5):
        handles = [
            hvd.allreduce_async(torch.full((100,), float(r)), name=f"mix.{i}", op=hvd.Sum) for i in range(8)
        ]
        assert comm.allreduce(r + step, op=MPI.SUM) == n * (n - 1) // 2 + n * step
        buf = np.full(4, r, dtype=np.int64)
        comm.Bcast(buf, root=step % n)
        assert buf.tolist() == [step % n] * 4
        if r == 0:
            comm.send(("hello", step), dest=n - 1, tag=7)
        if r == n - 1:
            assert comm.recv(source=0, tag=7) == ("hello", step)
        for h in handles:
            assert hvd.synchronize(h)[0].item() == n * (n - 1) // 2


def test_timeline_at_run_time(hvd: ModuleType, comm: Any, shared_tmp: Path) -> None:
    r = hvd.rank()
    path = shared_tmp / "timeline.json"
    hvd.start_timeline(str(path), mark_cycles=True)
    for step in range(2):
        hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(256) for _ in range(4)], name="tl"))  # fused
        hvd.allgather(torch.ones(2), name=f"tl.gather.{step}")
    hvd.stop_timeline()
    comm.Barrier()
    if r != 0:
        assert not path.exists() or path.stat().st_size > 0
        return
    events = json.loads(path.read_text())
    names = {e["name"] for e in events}
    for phase in (
        "NEGOTIATE_ALLREDUCE",
        "ALLREDUCE",
        "QUEUE",
        "MEMCPY_IN_FUSION_BUFFER",
        "COLLECTIVE",
        "MEMCPY_OUT_FUSION_BUFFER",
        "NEGOTIATE_ALLGATHER",
        "ALLGATHER",
        "CYCLE_START",
    ):
        assert phase in names, phase
    rows = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"allreduce.tl.0", "allgather.tl.gather.1"} <= rows
    for ph in ("B", "E"):  # spans are balanced per tensor row
        assert sum(1 for e in events if e.get("ph") == ph and e["name"] == "ALLREDUCE") == 8


def test_static_process_sets_and_reinit(hvd: ModuleType) -> None:
    """shutdown() then init(process_sets=...) starts a fresh engine with the static sets registered; a set
    equal to another (the global one included) is refused on every rank, as Horovod refuses it."""
    n, r = hvd.size(), hvd.rank()
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError):
        hvd.rank()
    with pytest.raises(ValueError, match="duplicates"):
        hvd.init(process_sets=[hvd.ProcessSet(list(range(n)))])
    assert not hvd.is_initialized()
    if n == 1:
        hvd.init()
        return
    first, rest = hvd.ProcessSet([0]), hvd.ProcessSet(list(range(1, n)))
    hvd.init(process_sets=[first, rest])
    assert first.process_set_id == 1 and rest.process_set_id == 2
    assert hvd.global_process_set.size() == n
    mine = first if r == 0 else rest
    y = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine)
    assert y.item() == (0.0 if r == 0 else float(sum(range(1, n))))


def test_process_sets_from_a_split_communicator(hvd: ModuleType) -> None:
    """Horovod's `hvd.init(process_sets=[hvd.ProcessSet(MPI.COMM_WORLD.Split(...))])`: every part of the
    split is registered (in the order of the first rank holding it) and each rank's object is its own part."""
    from mpi4py import MPI

    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a split of one rank is the global set")
    sub = MPI.COMM_WORLD.Split(color=r % 2, key=r)
    try:
        hvd.shutdown()
        split = hvd.ProcessSet(sub)
        hvd.init(process_sets=[split])
        assert split.ranks == list(range(r % 2, n, 2)) and split.process_set_id == 1 + r % 2
        assert split.included() and split.size() == len(split.ranks)
        y = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=split)
        assert y.item() == float(sum(split.ranks))
        with pytest.raises(NotImplementedError, match="communicator"):
            hvd.add_process_set(hvd.ProcessSet(sub))
        # The two halves finish apart: a rank that ended the test first and shut hpcring down (the next test's
        # fixture, or the end of the session) would stop the other half's engine before its set's op ran.
        hvd.barrier()
    finally:
        sub.Free()
