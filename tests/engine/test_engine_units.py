"""Single-process tests of the engine's pure parts: settings, response cache, validation messages, fusion
planning and the timeline file. (The multi-rank behaviour is in tests/ranked/engine and
tests/ranked/torch_ops.)"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcring.config import DEFAULT_FUSION_THRESHOLD, EngineSettings, engine_settings
from hpcring.engine import OpType, Signature
from hpcring.engine.bitvector import _pack_bits, _unpack_bits
from hpcring.engine.core import fallback
from hpcring.engine.host_buffers import _adjacent_span, _unpack
from hpcring.engine.host_plane import HostPlane
from hpcring.engine.request import Handle, Request, complete
from hpcring.engine.response_cache import ResponseCache
from hpcring.engine.responses import Response, plan_batches, plan_indices
from hpcring.engine.set_state import SetState
from hpcring.engine.table_check import check_agreement
from hpcring.engine.timeline import Timeline
from hpcring.errors import CollectiveError, ConfigError


def sig(name: str, shape: tuple[int, ...] = (4,), dtype: str = "float32", **kw: object) -> Signature:
    return Signature(name, kw.pop("op_type", OpType.ALLREDUCE), dtype, shape, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- settings


def test_defaults_match_horovod() -> None:
    s = engine_settings({})
    assert s == EngineSettings()
    assert s.fusion_threshold == DEFAULT_FUSION_THRESHOLD == 64 * 1024 * 1024
    assert (s.cycle_time_ms, s.cache_capacity, s.stall_check_time_s) == (1.0, 1024, 60.0)
    assert s.timeline is None and not s.stall_check_disable and s.allreduce_algorithm == "auto"


def test_hpcring_names_win_over_horovod_aliases() -> None:
    env = {
        "HOROVOD_FUSION_THRESHOLD": "1024",
        "HOROVOD_CYCLE_TIME": "5",
        "HPCRING_CYCLE_TIME": "2.5",
        "HOROVOD_CACHE_CAPACITY": "0",
        "HOROVOD_TIMELINE": "/tmp/t.json",
        "HPCRING_TIMELINE_MARK_CYCLES": "yes",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
        "HPCRING_STALL_SHUTDOWN_TIME_SECONDS": "30",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "HPCRING_LOG_LEVEL": "DEBUG",
    }
    s = engine_settings(env)
    assert s.fusion_threshold == 1024 and s.cycle_time_ms == 2.5 and s.cache_capacity == 0
    assert s.timeline == "/tmp/t.json" and s.timeline_mark_cycles
    assert (s.stall_check_time_s, s.stall_shutdown_time_s, s.stall_check_disable) == (10.0, 30.0, True)
    assert s.allreduce_algorithm == "hierarchical" and s.log_level == "debug"
    assert engine_settings({"HPCRING_ALLREDUCE_ALGORITHM": "Ring", **env}).allreduce_algorithm == "ring"


def test_dynamic_timeline_writes_nothing_until_started() -> None:
    """HOROVOD_TIMELINE=DYNAMIC (set by Horovod's own tests) is not a file name: the timeline starts only
    when start_timeline(path) is called; on the launcher's flag it stays the word, not a path in the cwd."""
    import argparse

    from hpcring.cli import run

    assert engine_settings({"HOROVOD_TIMELINE": "DYNAMIC"}).timeline is None
    assert engine_settings({"HPCRING_TIMELINE": "DYNAMIC.json"}).timeline == "DYNAMIC.json"
    parser = argparse.ArgumentParser()
    run.register(parser)
    flags = parser.parse_args(["--timeline-filename", "DYNAMIC", "--", "true"])
    assert run.engine_settings(flags)["HPCRING_TIMELINE"] == "DYNAMIC"


@pytest.mark.parametrize(
    ("text", "value"), [("67108864", 67108864), ("64MiB", 64 << 20), ("512k", 512 << 10), ("1 GB", 1 << 30)]
)
def test_fusion_threshold_sizes(text: str, value: int) -> None:
    assert engine_settings({"HPCRING_FUSION_THRESHOLD": text}).fusion_threshold == value


@pytest.mark.parametrize(
    ("var", "text", "says"),
    [
        ("HPCRING_FUSION_THRESHOLD", "lots", "not a byte count"),
        ("HPCRING_CYCLE_TIME", "fast", "not a number"),
        ("HPCRING_CYCLE_TIME", "-1", "expected a number >= 0"),
        ("HOROVOD_CACHE_CAPACITY", "1.5", "not an integer"),
        ("HPCRING_STALL_CHECK_DISABLE", "maybe", "not a boolean"),
        ("HPCRING_ALLREDUCE_ALGORITHM", "tree", "'auto', 'native', 'ring', 'hierarchical' or 'shm'"),
        ("HPCRING_LOG_LEVEL", "loud", "'warning'"),
        ("HPCRING_STALL_CHECK_TIME_SECONDS", "nan", "out of range"),
    ],
)
def test_bad_settings_name_variable_value_and_allowed(var: str, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        engine_settings({var: text})
    assert var in str(info.value) and repr(text) in str(info.value) and says in str(info.value)


# ---------------------------------------------------------------- response cache


def test_cache_lookup_requires_identical_signature() -> None:
    c = ResponseCache(4)
    assert c.put(sig("a")) is None and c.lookup(sig("a")) == 0
    assert c.lookup(sig("a", (5,))) is None and c.lookup(sig("b")) is None
    assert c.evict("a") == 0 and c.lookup(sig("a")) is None and len(c) == 0
    assert c.put(sig("b")) is None and c.bit_of("b") == 0, "freed positions are reused lowest first"


def test_cache_evicts_least_recently_executed() -> None:
    c = ResponseCache(2)
    c.put(sig("a"))
    c.put(sig("b"))
    c.put(sig("a"))  # a executed again: b is now the oldest
    assert c.put(sig("c")) == 1 and c.bit_of("c") == 1 and c.bit_of("b") is None
    assert c.words == 1 and sorted(c.bits()) == [0, 1]


def test_cache_is_deterministic_for_the_same_history() -> None:
    history = [sig(f"t{i % 7}", (i % 3 + 1,)) for i in range(50)]
    a, b = ResponseCache(5), ResponseCache(5)
    for s in history:
        assert a.put(s) == b.put(s)
    assert {bit: a.signature(bit) for bit in a.bits()} == {bit: b.signature(bit) for bit in b.bits()}


def test_cache_capacity_zero_stores_nothing() -> None:
    c = ResponseCache(0)
    assert c.put(sig("a")) is None and c.lookup(sig("a")) is None and c.words == 0


# ---------------------------------------------------------------- validation


def test_agreement_and_grouped_mismatch_message() -> None:
    ranks = (0, 1, 2, 3)
    assert check_agreement({r: sig("x") for r in ranks}, ranks) is None
    sigs = {0: sig("x"), 1: sig("x", (5,)), 2: sig("x"), 3: sig("x", (5,), "float64")}
    msg = check_agreement(sigs, ranks)
    assert msg is not None
    assert "Mismatched allreduce of tensor 'x' across ranks" in msg
    assert "dtype: ranks 0, 1, 2 have float32; rank 3 has float64" in msg
    assert "shape: ranks 0, 2 have (4,); ranks 1, 3 have (5,)" in msg


def test_messages_speak_world_ranks_of_a_process_set() -> None:
    msg = check_agreement(
        {0: sig("x", root=0, op_type=OpType.BROADCAST), 1: sig("x", root=1, op_type=OpType.BROADCAST)}, (2, 5)
    )
    assert msg is not None and "root rank: rank 2 has 0; rank 5 has 1" in msg


def test_ragged_ops_compare_trailing_dims_only() -> None:
    same = {0: sig("g", (-1, 3), op_type=OpType.ALLGATHER), 1: sig("g", (-1, 3), op_type=OpType.ALLGATHER)}
    assert check_agreement(same, (0, 1)) is None
    diff = {0: sig("g", (-1, 3), op_type=OpType.ALLGATHER), 1: sig("g", (-1, 2), op_type=OpType.ALLGATHER)}
    msg = check_agreement(diff, (0, 1))
    assert msg is not None and "rank 0 has (*, 3); rank 1 has (*, 2)" in msg and "but the first" in msg


def test_operation_mismatch_and_device_mismatch() -> None:
    msg = check_agreement({0: sig("x"), 1: sig("x", op_type=OpType.BROADCAST)}, (0, 1))
    assert msg is not None and "operation: rank 0 has allreduce; rank 1 has broadcast" in msg
    msg = check_agreement({0: sig("x"), 1: sig("x", device="cuda")}, (0, 1))
    assert msg is not None and "device: rank 0 has cpu; rank 1 has cuda" in msg


# ---------------------------------------------------------------- fusion planning


def test_plan_fuses_compatible_allreduces_up_to_the_threshold() -> None:
    rs = [Response(sig(f"a{i}", (256,)), None) for i in range(5)]  # 1 KiB each
    assert [len(b) for b in plan_batches(rs, 3 * 1024)] == [3, 2]
    assert [len(b) for b in plan_batches(rs, 5 * 1024)] == [5], "exactly at the threshold: one batch"
    assert [len(b) for b in plan_batches(rs, 0)] == [1] * 5, "threshold 0 disables fusion"
    mixed = [
        Response(sig("f"), None),
        Response(sig("d", dtype="float64"), None),
        Response(sig("f2"), None),
        Response(sig("b", op_type=OpType.BARRIER), None),
        Response(sig("f3"), None),
    ]
    names = [[r.sig.name for r in b] for b in plan_batches(mixed, 1 << 20)]
    assert names == [["f", "f2"], ["d"], ["b"], ["f3"]], "looks past other dtypes, never past another op"
    errors = [Response(sig("e1"), None, error="bad"), Response(sig("e2"), None)]
    assert [len(b) for b in plan_batches(errors, 1 << 20)] == [1, 1]


@given(st.sets(st.integers(0, 1023), max_size=300))
def test_bit_sets_round_trip_in_order(bits: set[int]) -> None:
    """The negotiation vector's bit sets: both packing paths (few bits: ints; many: numpy) agree with the
    plain definition, and unpacking returns the positions in increasing order (the execution order)."""
    mask = _pack_bits(bits, len(bits))
    assert mask == sum(1 << b for b in bits)
    assert _unpack_bits(mask) == sorted(bits)
    if bits:  # a run of consecutive positions takes the shortcut both ways
        run = set(range(min(bits), min(bits) + len(bits)))
        assert _pack_bits(run, len(run)) == sum(1 << b for b in run)
        assert _unpack_bits(sum(1 << b for b in run)) == sorted(run)


def test_handles_complete_in_one_pass_and_wake_every_waiter() -> None:
    handles = [Handle(f"h{i}") for i in range(3)]
    got: list[object] = []
    waiters = [threading.Thread(target=lambda h=h: got.append(h.wait(timeout=30))) for h in handles[:2]]
    waiters.append(threading.Thread(target=lambda: got.append(handles[0].wait(timeout=30))))  # same handle
    for w in waiters:
        w.start()
    time.sleep(0.05)  # let them block (the result is the same if they have not yet)
    assert not any(h.done() for h in handles)
    complete(handles, ["a", "b", "c"])
    for w in waiters:
        w.join(timeout=30)
    assert sorted(map(str, got)) == ["a", "a", "b"] and all(h.done() for h in handles)
    assert handles[2].wait(timeout=0) == "c", "an already completed handle answers without blocking"


def test_handle_error_and_timeout() -> None:
    h = Handle("slow")
    with pytest.raises(TimeoutError, match=r"'slow' did not complete within 0\.05 s"):
        h.wait(timeout=0.05)
    if isinstance(h, fallback.Handle):  # the Python twin's gates (the compiled one keeps no per-wait state)
        assert h._gates == [], "a timed-out waiter unregisters its gate"
    complete([h, Handle("other")], None, CollectiveError("boom"))
    with pytest.raises(CollectiveError, match="boom"):
        h.wait()


def test_request_defaults() -> None:
    s = sig("r")
    req = Request(s, 0)
    assert req.handle.name == "r" and req.tensor is None and req.output is None and req.submitted_at > 0
    assert s.numel == 4 and sig("g", (-1, 3), op_type=OpType.ALLGATHER).numel == 0 and sig("e", ()).numel == 1


def reference_plan(responses: list[Response], limit: int) -> list[list[str]]:
    """The planning rule written plainly (the first version's loop), to check the fast paths against."""

    def key(r: Response) -> tuple[object, ...] | None:
        if r.sig.op_type is not OpType.ALLREDUCE or r.error is not None or limit <= 0:
            return None
        return (r.sig.dtype, r.sig.reduce_op, r.sig.prescale, r.sig.postscale, r.sig.device)

    def size(r: Response) -> int:
        return r.sig.numel * (8 if r.sig.dtype == "float64" else 4)

    used, out = [False] * len(responses), []
    for i, r in enumerate(responses):
        if used[i]:
            continue
        used[i], batch, total = True, [r.sig.name], size(r)
        if key(r) is not None:
            for j in range(i + 1, len(responses)):
                o = responses[j]
                if o.sig.op_type is not OpType.ALLREDUCE:
                    break
                if not used[j] and key(o) == key(r) and total + size(o) <= limit:
                    used[j], total = True, total + size(o)
                    batch.append(o.sig.name)
        out.append(batch)
    return out


@given(
    st.lists(
        st.tuples(
            st.sampled_from([OpType.ALLREDUCE] * 4 + [OpType.BARRIER, OpType.ALLGATHER]),
            st.sampled_from(["float32", "float64"]),
            st.integers(0, 64),
            st.sampled_from([1.0, 0.5]),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([0, 64, 256, 1 << 20]),
)
def test_plan_matches_the_plain_rule(items: list[tuple[OpType, str, int, float, bool]], limit: int) -> None:
    rs = [
        Response(sig(f"t{i}", (n,), dtype, op_type=op, prescale=pre), None, error="bad" if err else None)
        for i, (op, dtype, n, pre, err) in enumerate(items)
    ]
    assert [[r.sig.name for r in b] for b in plan_batches(rs, limit)] == reference_plan(rs, limit)


def test_plan_indices_are_the_plan_as_positions() -> None:
    rs = [Response(sig(f"a{i}", (256,), "float64" if i % 3 == 0 else "float32"), None) for i in range(7)]
    for limit in (0, 2048, 1 << 20):
        batches = plan_batches(rs, limit)
        assert [[rs[i] for i in idx] for idx in plan_indices(rs, limit)] == batches


# ---------------------------------------------------------------- steady-state helpers


def test_cache_bulk_lookup_touch_and_version() -> None:
    c = ResponseCache(4)
    a, b = sig("a"), sig("b")
    c.put(a)
    c.put(b)
    v = c.version
    assert c.lookup_all([b, a]) == [1, 0] and c.signatures([1, 0]) == [b, a]
    assert c.lookup_all([a, sig("b", (5,))]) is None, "one different signature: no bulk answer"
    assert c.lookup_all([a, sig("z")]) is None
    assert c.touch([0], [a]) and c.version == v, "touching reorders the LRU only"
    assert c.put(sig("c")) is None and c.put(sig("d")) is None and c.version == v + 2
    assert c.put(sig("e")) == 1, "b (not touched) was the least recently executed"
    assert not c.touch([1], [b]), "bit 1 holds another signature now"
    assert not c.touch([1], [b], version=c.version - 1), "an older version: compared, still refused"
    assert c.touch([1], [c.signature(1)], version=c.version), "the same version: no comparison needed"
    v = c.version
    c.put(sig("e"))  # the same signature object again: nothing changes but the LRU
    assert c.version == v + 1, "an equal but new signature object counts as a change"
    e = c.signature(1)
    c.put(e)
    assert c.version == v + 1
    c.evict("e")
    assert c.version == v + 2


class _Buffer:
    """What the engine reads from `mpi4py.MPI.buffer` (not imported here: no MPI in unit tests)."""

    def __init__(self, a: np.ndarray) -> None:
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            raise BufferError("not contiguous")
        self.address, self.nbytes, self.readonly = int(a.ctypes.data), a.nbytes, not a.flags.writeable


def test_adjacent_span_accepts_back_to_back_views_only() -> None:
    flat = np.arange(40, dtype=np.float32)
    views = [flat[2:6], flat[6:12].reshape(2, 3), flat[12:13]]
    found = _adjacent_span(views, _Buffer)
    assert found is not None
    start, span = found
    assert start == int(flat.ctypes.data) + 8 and span.shape == (11,) and span.dtype == np.float32
    np.testing.assert_array_equal(span, flat[2:13])
    span[:] = -1
    assert (flat[2:13] == -1).all() and flat[1] == 1 and flat[13] == 13, "the span is exactly their memory"
    assert _adjacent_span(views[::-1], _Buffer) is None, "reversed order"
    assert _adjacent_span([flat[0:4], flat[5:9]], _Buffer) is None, "a gap"
    assert _adjacent_span([flat[0:8:2], flat[8:16:2]], _Buffer) is None, "strided"
    assert _adjacent_span([np.ones(4), np.ones(4)], _Buffer) is None, "separate allocations"
    mixed = [flat[0:4], flat[4:8].view(np.int32)]
    assert _adjacent_span(mixed, _Buffer) is None, "one dtype only"
    grid = np.arange(24, dtype=np.float32)
    fortran = [grid[0:12].reshape(4, 3, order="F"), grid[12:24].reshape(4, 3, order="F")]
    assert _adjacent_span(fortran, _Buffer) is None, "contiguous in Fortran order only"
    frozen = flat.copy()
    frozen.flags.writeable = False
    ro = [frozen[0:4], frozen[4:8]]
    assert _adjacent_span(ro, _Buffer) is not None
    assert _adjacent_span(ro, _Buffer, writeable=True) is None, "outputs must be writeable"


def test_unpack_fills_every_output_shape() -> None:
    buf = np.arange(1 + 6 + 4 + 3, dtype=np.float64)
    outs = [np.empty(()), np.empty((2, 3)), np.empty(4), np.empty((3, 1))]
    _unpack(buf, [1, 6, 4, 3], outs)
    np.testing.assert_array_equal(np.concatenate([o.reshape(-1) for o in outs]), buf)
    flat_outs = [np.empty(5), np.empty(9)]
    _unpack(buf, [5, 9], flat_outs)
    np.testing.assert_array_equal(np.concatenate(flat_outs), buf)


def test_complete_refuses_a_result_count_that_does_not_match() -> None:
    with pytest.raises(ValueError, match="2 results for 1 handles"):
        complete([Handle("x")], ["a", "b"])


# ---------------------------------------------------------------- timeline


def test_timeline_is_valid_chrome_trace(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tl.json"
    tl = Timeline(str(path), mark_cycles=True)
    tl.begin("grad.w", "NEGOTIATE_ALLREDUCE")
    tl.instant("grad.w", "rank 1 ready", args={"rank": 1})
    tl.end("grad.w", "NEGOTIATE_ALLREDUCE")
    with tl.span(["grad.w", "grad.b"], "COLLECTIVE"):
        pass
    tl.cycle(3)
    tl.close()
    tl.close()  # idempotent
    events = json.loads(path.read_text())
    rows = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(rows) >= {"grad.w", "grad.b"}
    spans = [(e["name"], e["ph"], e["pid"]) for e in events if e["ph"] in "BE"]
    assert (
        spans.count(("COLLECTIVE", "B", rows["grad.b"])) == 1 and ("COLLECTIVE", "E", rows["grad.w"]) in spans
    )
    assert any(e["name"] == "CYCLE_START" for e in events)
    assert all(isinstance(e.get("ts", 0), (int, float)) for e in events)
    start = next(e for e in events if e["pid"] == 0 and e["name"] == "process_name")["args"]
    assert abs(start["start_time_since_epoch_in_micros"] / 1e6 - time.time()) < 60  # Horovod's header field


def test_timeline_reopened_in_the_same_process_continues_the_file(tmp_path: Path) -> None:
    """A re-initialised engine writing to the same path keeps one valid trace instead of truncating it."""
    path = tmp_path / "tl.json"
    first = Timeline(str(path))
    first.begin("a", "ALLREDUCE")
    first.end("a", "ALLREDUCE")
    first.close()
    assert json.loads(path.read_text())  # valid after the first close
    second = Timeline(str(path))
    second.begin("b", "ALLGATHER")
    second.end("b", "ALLGATHER")
    second.close()
    events = json.loads(path.read_text())
    spans = [(e["name"], e["ph"]) for e in events if e["ph"] in "BE"]
    assert spans == [("ALLREDUCE", "B"), ("ALLREDUCE", "E"), ("ALLGATHER", "B"), ("ALLGATHER", "E")]
    assert sum(1 for e in events if e["name"] == "trace_end") == 1


def test_timeline_events_reach_the_file_while_it_is_open(tmp_path: Path) -> None:
    """A script reading the trace while the job runs (Horovod's timeline test does) sees the events
    without waiting for close(): the flusher writes them out within its interval."""
    path = tmp_path / "tl.json"
    tl = Timeline(str(path))
    tl.begin("allreduce.x", "NEGOTIATE_ALLREDUCE")
    tl.end("allreduce.x", "NEGOTIATE_ALLREDUCE")
    deadline = time.monotonic() + 30
    while "NEGOTIATE_ALLREDUCE" not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    text = path.read_text()
    tl.close()
    assert "allreduce.x" in text and "NEGOTIATE_ALLREDUCE" in text


def _one_rank_state() -> SetState:
    """The state of a set of one rank (its topology is only read for comm, rank and size)."""
    return SetState(0, (0,), SimpleNamespace(comm=None, rank=0, size=1), EngineSettings())


def test_a_fused_batch_on_one_rank_is_its_input_copied_and_scaled() -> None:
    """A set of one rank: one output elsewhere gets its input (reshaped to the output), in place is left
    alone, then the postscale; AVERAGE divides by one."""
    a = np.arange(6, dtype=np.float32)
    b = np.arange(4, dtype=np.float32).reshape(2, 2)
    out_a = np.empty((2, 3), np.float32)
    s = sig("x", (6,), reduce_op="average", postscale=3.0)
    got = HostPlane._allreduce_alone(_one_rank_state(), [a, b], [out_a, b], [6, 4], np.dtype(np.float32), s)
    assert got[0] is out_a and got[1] is b
    np.testing.assert_array_equal(out_a, 3.0 * a.reshape(2, 3))
    np.testing.assert_array_equal(b, 3 * np.arange(4).reshape(2, 2))
    np.testing.assert_array_equal(a, np.arange(6))


def test_one_rank_outputs_over_other_inputs_read_every_input_first() -> None:
    """Outputs shifted by one request over the inputs: every input is read before any output is written (one
    by one, the first copy would overwrite the second input)."""
    flat = np.arange(20, dtype=np.float64)
    ins = [flat[4 * i : 4 * (i + 1)] for i in range(4)]
    outs = [flat[4 * (i + 1) : 4 * (i + 2)] for i in range(4)]
    s = sig("shift", (4,), dtype="float64")
    HostPlane._allreduce_alone(_one_rank_state(), ins, outs, [4] * 4, np.dtype(np.float64), s)
    np.testing.assert_array_equal(flat, np.r_[np.arange(4), np.arange(16)].astype(np.float64))


def test_signature_shape_keeps_trailing_dims_of_ragged_ops_only() -> None:
    from hpcring.engine.request import signature_shape

    for op in OpType:
        ragged = op in (OpType.ALLGATHER, OpType.ALLTOALL)
        assert signature_shape(op, (5, 3, 2)) == ((-1, 3, 2) if ragged else (5, 3, 2))
        assert signature_shape(op, ()) == ()


def test_deferred_wake_is_per_thread_and_off_in_a_new_thread() -> None:
    """A thread inside `deferred_wake` must not silence another thread's wake-ups (the flag is a
    thread-local with a class-level default, read on every submit)."""
    from hpcring.engine import caller_cycles as inline
    from hpcring.engine.engine_state import EngineState

    def fake() -> inline.CallerCycles:
        return inline.CallerCycles(EngineState(EngineSettings()), queue.SimpleQueue(), lambda: False)

    seen: list[bool] = []
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait()
        seen.append(inline.wake_deferred())
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with fake().deferred_wake():
        assert inline.wake_deferred()
        inside.set()
        release.wait(10)
    t.join(10)
    assert seen == [False] and not inline.wake_deferred()
