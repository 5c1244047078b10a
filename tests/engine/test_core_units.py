"""The request path's core, compiled and pure Python side by side: handles, completion, requests, pendings.

Every case runs against both implementations (the compiled one where it was built), so the fallback keeps
the compiled core's behaviour and the other way round.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from types import ModuleType

import pytest

from hpcring.engine import OpType, Signature
from hpcring.engine.core import fallback

try:
    from hpcring.engine.core import _core as compiled
except ImportError:  # not built here: the compiled cases are skipped, and test_core_built says why
    compiled = None  # type: ignore[assignment]

IMPLS = [pytest.param(fallback, id="python"), pytest.param(compiled, id="compiled")]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param is None:
        pytest.skip("the compiled core is not built in this environment")
    return request.param  # type: ignore[no-any-return]


def test_a_handle_completes_once_with_its_result(impl: ModuleType) -> None:
    h = impl.Handle("a")
    assert h.name == "a" and h.event is None and not h.done()
    impl.complete([h], [41])
    assert h.done() and h.wait() == 41 and h.wait(timeout=0) == 41


def test_an_error_is_raised_by_every_wait(impl: ModuleType) -> None:
    hs = [impl.Handle(f"e{i}") for i in range(3)]
    boom = RuntimeError("boom")
    impl.complete(hs, None, boom)
    for h in hs:
        with pytest.raises(RuntimeError, match="boom") as caught:
            h.wait()
        assert caught.value is boom


def test_a_wait_that_times_out_names_the_request(impl: ModuleType) -> None:
    h = impl.Handle("slow")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"request 'slow' did not complete within 0.05 s"):
        h.wait(0.05)
    assert time.monotonic() - start >= 0.04
    with pytest.raises(TimeoutError):
        h.wait(-1)  # a negative timeout: do not wait at all
    h.set_result("late")
    assert h.wait(0.05) == "late"


def test_completion_wakes_every_waiting_thread(impl: ModuleType) -> None:
    hs = [impl.Handle(f"w{i}") for i in range(8)]
    got: dict[int, object] = {}

    def waiter(i: int) -> None:
        got[i] = hs[i % 4].wait(timeout=30)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    impl.complete(hs[:4], [f"r{i}" for i in range(4)])
    for t in threads:
        t.join(30)
    assert got == {i: f"r{i % 4}" for i in range(8)}


def test_results_must_match_the_handles(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="2 results for 1 handles"):
        impl.complete([impl.Handle("x")], ["a", "b"])
    with pytest.raises(ValueError, match="1 results for 2 handles"):
        impl.complete([impl.Handle("x"), impl.Handle("y")], ["a"])


def test_a_signal_reaches_the_main_thread_while_it_waits(impl: ModuleType) -> None:
    class Interrupted(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        start = time.monotonic()
        with pytest.raises(Interrupted):
            impl.Handle("never").wait()
        assert time.monotonic() - start < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_request_names_its_handle_and_records_when(impl: ModuleType) -> None:
    sig = Signature("req.x", OpType.ALLREDUCE, "float32", (4,))
    before = time.monotonic()
    req = impl.Request(sig, 0)
    assert req.handle.name == "req.x" and before <= req.submitted_at <= time.monotonic()
    assert req.tensor is None and req.output is None and req.splits is None and req.ready is None
    unnamed = impl.Handle("")
    req = impl.Request(
        sig, 3, tensor="t", output="o", splits="s", handle=unnamed, submitted_at=1.5, ready="e"
    )
    assert req.handle is unnamed and unnamed.name == "req.x" and req.submitted_at == 1.5
    assert (req.process_set_id, req.tensor, req.output, req.splits, req.ready) == (3, "t", "o", "s", "e")
    named = impl.Handle("kept")
    assert impl.Request(sig, 0, handle=named).handle.name == "kept"
    assert repr(req) == f"Request({sig!r}, process_set_id=3)"
    req.tensor = "changed"
    assert req.tensor == "changed"


def test_a_pending_result_is_its_finish_or_what_it_keeps(impl: ModuleType) -> None:
    h = impl.Handle("p")
    assert impl.Pending([h], None, "output").result(["ignored"]) == "output"
    p = impl.Pending([h], lambda results: ("finished", results))
    assert p.result([1]) == ("finished", [1]) and p.keep is None and p.handles == [h]


class _Holder:
    """Something a result can be that refers back to its handle: a cycle only the collector frees."""

    handle: object = None


def test_a_cycle_through_a_handles_outcome_is_collected(impl: ModuleType) -> None:
    req = impl.Request(Signature("cyc", OpType.ALLREDUCE, "float32", (1,)), 0)
    holder = _Holder()
    holder.handle = req.handle
    impl.complete([req.handle], [holder])
    alive = weakref.ref(holder)
    del req, holder
    gc.collect()
    assert alive() is None


def test_an_in_flight_handle_stays_out_of_the_collector() -> None:
    """The compiled core's handles (and the one-call submit's requests) are not tracked until an outcome
    could close a cycle: a step's in-flight requests do not fill the young generation (engine.md)."""
    if compiled is None:
        pytest.skip("the compiled core is not built in this environment")
    h = compiled.Request(Signature("gc", OpType.ALLREDUCE, "float32", (1,)), 0).handle
    assert not gc.is_tracked(h)
    compiled.complete([h], [object()])
    assert gc.is_tracked(h)
    assert gc.is_tracked(compiled.Handle("made.from.python"))  # a Python-made one is tracked from the start


def test_the_environment_can_force_the_python_path() -> None:
    code = "from hpcring.engine import core; print(core.kind(), core.forced(), core.describe())"
    env = {**os.environ, "HPCRING_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[:2] == ["python", "True"] and "HPCRING_PURE_PYTHON=1" in out.stdout
    env["HPCRING_PURE_PYTHON"] = "maybe"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "HPCRING_PURE_PYTHON='maybe' is not a boolean" in out.stderr


def test_core_built() -> None:
    """The project's own set-up (make setup, CI) has a C compiler: there the compiled core must be in use,
    so a broken build cannot leave CI testing the fallback alone."""
    from hpcring.engine import core

    if core.forced():
        pytest.skip("HPCRING_PURE_PYTHON=1: the Python path was asked for")
    assert core.kind() == "compiled", core.describe()


@pytest.mark.parametrize(
    "node_sizes",
    [(1,), (2,), (4,), (8,), (2, 2), (4, 4), (1, 1, 1), (3, 1)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("algorithm", ["auto", "native", "ring", "shm", "hierarchical"])
def test_the_lone_cycles_size_limit_is_where_auto_stops_picking_mpis_own(
    node_sizes: tuple[int, ...], algorithm: str
) -> None:
    """The compiled lone cycle calls MPI_Allreduce itself for requests up to `native_max_bytes`: exactly
    those the host plane would hand to MPI's own allreduce (selection.choose_algorithm) and a waiting thread
    runs (INLINE_MAX_BYTES); none under a configured algorithm other than auto or native."""
    from types import SimpleNamespace

    from hpcring.collective.selection import choose_algorithm
    from hpcring.config import EngineSettings
    from hpcring.engine.caller_cycles import INLINE_MAX_BYTES
    from hpcring.engine.host_plane import ENGINE_SHM_MIN_RANKS
    from hpcring.engine.lone_cycle import native_max_bytes

    settings = EngineSettings(allreduce_algorithm=algorithm)
    st = SimpleNamespace(topology=SimpleNamespace(node_sizes=node_sizes))
    limit = native_max_bytes(settings, st)  # type: ignore[arg-type]

    def picked(nbytes: int) -> str:
        if algorithm != "auto":
            return algorithm
        return choose_algorithm(
            nbytes,
            native_exact=True,
            local_size=max(node_sizes),
            cross_size=len(node_sizes),
            shm_min_ranks=ENGINE_SHM_MIN_RANKS,
        )

    if algorithm not in ("auto", "native"):
        assert limit == -1
        return
    assert 0 < limit <= INLINE_MAX_BYTES
    assert all(picked(n) == "native" for n in (1, limit // 2, limit))
    assert limit == INLINE_MAX_BYTES or picked(limit + 1) != "native"


def test_the_engine_lock_behaves_as_threading_lock(impl: ModuleType) -> None:
    """The compiled core's Lock keeps threading.Lock's interface and rules (the Python path's is one)."""
    lock = impl.Lock() if impl is compiled else fallback.Lock()
    assert not lock.locked()
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(blocking=False) is False
    start = time.monotonic()
    assert lock.acquire(timeout=0.05) is False
    assert time.monotonic() - start >= 0.04
    lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with pytest.raises(ValueError, match="can't specify a timeout for a non-blocking call"):
        lock.acquire(False, 1)
    with pytest.raises(ValueError, match="timeout value must be"):
        lock.acquire(timeout=-2)


def test_a_thread_waiting_for_the_engine_lock_lets_the_others_run(impl: ModuleType) -> None:
    """A wait releases the GIL: the holder runs Python while the waiter waits, and the waiter gets the lock
    once it is released."""
    lock = impl.Lock() if impl is compiled else fallback.Lock()
    lock.acquire()
    got: list[float] = []
    waiter = threading.Thread(target=lambda: (lock.acquire(), got.append(time.monotonic()), lock.release()))
    waiter.start()
    spins = 0
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # Python work on this thread while the waiter blocks
        spins += 1
    released_at = time.monotonic()
    lock.release()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and got and got[0] >= released_at and spins > 1000


def test_ctrl_c_reaches_a_thread_waiting_for_the_engine_lock() -> None:
    """A signal interrupts the wait and its handler runs (KeyboardInterrupt), as with threading.Lock."""
    if compiled is None:
        pytest.skip("the compiled core is not built in this environment")
    code = (
        "import os, signal, threading\n"
        "from hpcring.engine.core import _core\n"
        "lock = _core.Lock(); lock.acquire()\n"
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    lock.acquire()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', lock.locked())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "interrupted True", out.stderr
