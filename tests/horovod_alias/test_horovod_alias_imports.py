"""The horovod alias in every import form, Horovod's thread helpers, alias modules sent to another process.

Horovod's own test helpers (`test/utils/common.py`) import `horovod.runner.util.threads.in_thread`;
`from horovod.x import missing_name` must say what `horovod.x.missing_name` says; a function that uses a
module-level `import horovod.torch as hvd` must survive cloudpickle (Spark, Ray and `horovod.run` send it).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from support import ROOT

from hpcring.horovod_alias import HorovodFeatureMissing, HorovodNameUnavailable, install, uninstall
from hpcring.horovod_alias.table import TABLE

cloudpickle = pytest.importorskip("cloudpickle")
pytest.importorskip("torch")

MISSING = [(n, m) for n, a in sorted(TABLE.items()) for m in sorted(a.missing)]


@pytest.fixture
def alias() -> Iterator[None]:
    install()
    yield
    uninstall()


@pytest.mark.parametrize(("name", "missing"), MISSING)
def test_from_import_of_a_missing_name_gives_the_attributes_message(
    alias: None, name: str, missing: str
) -> None:
    module = importlib.import_module(name)
    with pytest.raises(HorovodFeatureMissing) as by_attribute:
        getattr(module, missing)
    with pytest.raises(HorovodNameUnavailable) as by_from:
        exec(f"from {name} import {missing}", {})
    with pytest.raises(ImportError) as by_import:
        importlib.import_module(f"{name}.{missing}")
    assert str(by_from.value) == str(by_import.value) == str(by_attribute.value)
    assert by_from.value.name == f"{name}.{missing}"


def test_from_import_of_a_misspelt_name_suggests_the_right_one(alias: None) -> None:
    with pytest.raises(HorovodNameUnavailable, match=r"horovod\.torch\.allreduce_asyn .*allreduce_async"):
        exec("from horovod.torch import allreduce_asyn", {})


def test_from_import_of_names_that_exist_still_works(alias: None) -> None:
    namespace: dict[str, object] = {}
    exec("from horovod.runner.util.threads import in_thread, on_event", namespace)
    exec("from horovod.spark.common.backend import SparkBackend, Backend", namespace)
    import hpcring.horovod_alias.threads as threads
    import hpcring.spark.common.backend as backend

    assert namespace["in_thread"] is threads.in_thread
    assert namespace["SparkBackend"] is backend.SparkBackend


def test_in_thread_runs_the_target_in_a_daemon_thread_and_checks_its_args() -> None:
    from hpcring.horovod_alias.threads import in_thread

    seen: list[tuple[str, bool]] = []
    thread = in_thread(lambda x: seen.append((x, threading.current_thread().daemon)), ("a",), name="t1")
    thread.join(30)
    assert seen == [("a", True)] and thread.name == "t1"
    with pytest.raises(ValueError, match="args must be a tuple"):
        in_thread(print, args=["a"])  # type: ignore[arg-type]
    in_thread(lambda: 1 / 0, silent=True, daemon=False).join(30)  # swallowed: nothing escapes


def test_on_event_calls_once_set_and_never_once_stopped() -> None:
    from hpcring.horovod_alias.threads import on_event

    event, stop, calls = threading.Event(), threading.Event(), list[str]()
    waiter = on_event(event, calls.append, ("fired",))
    stopped = on_event(threading.Event(), calls.append, ("never",), stop=stop, check_stop_interval_s=0.01)
    event.set()
    stop.set()
    waiter.join(30)
    stopped.join(30)
    assert calls == ["fired"]
    with pytest.raises(ValueError, match="Stop event must be given"):
        on_event(event, print, daemon=False)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the 1 / 0 thread
def test_execute_function_multithreaded_returns_results_by_index() -> None:
    from hpcring.horovod_alias.threads import execute_function_multithreaded

    results = execute_function_multithreaded(lambda a, b: a * b, [[i, 10] for i in range(7)], True, 3)
    assert results == {i: i * 10 for i in range(7)}
    with pytest.raises(RuntimeError, match="did not complete"):
        execute_function_multithreaded(lambda x: 1 / x, [[1], [0]])


def test_an_alias_module_and_a_function_using_it_travel_by_reference(alias: None) -> None:
    """Pickled here, loaded in a fresh interpreter that never set HPCRING_HOROVOD: the alias modules come
    back as hpcring's, installed by the unpickling."""
    import horovod
    import horovod.torch

    script = {"hvd": horovod.torch, "__name__": "user_script"}  # a module cloudpickle cannot import
    exec("def fn():\n    return hvd.allreduce, hvd.elastic.run, hvd.__name__\n", script)
    payload = cloudpickle.dumps((script["fn"], horovod))
    check = (
        "import pickle, sys; import hpcring.torch as h; fn, top = pickle.loads(sys.stdin.buffer.read()); "
        "a, r, n = fn(); assert a is h.allreduce and r is h.elastic.run and n == 'horovod.torch', n; "
        "assert top.__name__ == 'horovod' and callable(top.run); print('ok')"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", check], input=payload, capture_output=True, env=env, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == b"ok", out.stderr.decode()
