"""`hpcring.run(fn, ...)` (horovod.run) end to end: real launches at 1, 2 and 4 ranks, each under a timeout.

The calls run in tests/launch/run_function_driver.py, a subprocess with its own private TMPDIR: a hang fails
the test, and the folder the call used must be gone afterwards. Bad arguments are checked in this process:
they fail before anything starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, flavour_python

import hpcring
from hpcring.errors import ConfigError

pytestmark = pytest.mark.mpi
DRIVER = str(Path(__file__).with_name("run_function_driver.py"))


def call(
    case: str, np: int, tmp_path: Path, timeout: int = 180, python: str = sys.executable
) -> dict[str, Any]:
    private = tmp_path / "tmp"
    private.mkdir()
    env = {**os.environ, "TMPDIR": str(private), "HPCRING_HOROVOD": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["timeout", "-k", "5", str(timeout), python, DRIVER, case, str(np)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert list(private.iterdir()) == [] and list(tmp_path.glob(".hpcring-run-*")) == []  # nothing left
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    out["output"] = proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("np", [1, 2, 4])
def test_results_come_back_in_rank_order(tmp_path: Path, np: int) -> None:
    out = call("values", np, tmp_path)
    assert out.get("ok") == [
        {"value": r * 10 + np, "env": "from env=", "horovod": "1", "closure": 7} for r in range(np)
    ], out


def test_horovod_run_sends_a_function_using_a_module_level_horovod_torch(tmp_path: Path) -> None:
    """Horovod's shape: `horovod.run(train, np=2)`, train using the script's `import horovod.torch as hvd`."""
    out = call("horovod", 2, tmp_path)
    assert out.get("ok") == [[r, 2, 2.0, "horovod.torch"] for r in range(2)], out


def test_ctrl_c_ends_the_ranks_and_raises_keyboard_interrupt(tmp_path: Path) -> None:
    out = call("interrupt", 2, tmp_path, timeout=60)  # the ranks would sleep 120 s
    assert out.get("ok") == "KeyboardInterrupt", out
    assert "received SIGINT; ending all ranks" in out["output"]


def test_results_under_mpich(tmp_path: Path) -> None:
    out = call("values", 2, tmp_path, python=flavour_python("mpich"))
    assert [r["value"] for r in out.get("ok", [])] == [2, 12], out


def test_elastic_keywords_run_an_elastic_job(tmp_path: Path) -> None:
    out = call("elastic", 2, tmp_path)
    assert out.get("ok") == [[r, 3] for r in range(3)], out  # max_num_proc ranks: the host has the slots
    assert "elastic: world 0: 3 ranks on" in out["output"]


def test_output_filename_and_verbose(tmp_path: Path) -> None:
    out = call("output", 2, tmp_path)
    assert out.get("ok") == [None, None], out
    for r in range(2):
        assert (tmp_path / "out" / f"rank.{r}" / "stdout").read_text() == f"hello from rank {r}\n"
    assert "hpcring.run: openmpi" in out["output"]  # verbose: the mpiexec line


@pytest.mark.parametrize("np", [1, 2, 4])
def test_a_function_using_hpcring_torch_collectives(tmp_path: Path, np: int) -> None:
    pytest.importorskip("torch")
    out = call("torch", np, tmp_path, timeout=240)
    assert out.get("ok") == [{"rank": r, "size": np, "sum": np * (np + 1) / 2} for r in range(np)], out


@pytest.mark.parametrize("np", [1, 2, 4])
def test_an_exception_in_a_rank_is_raised_naming_it(tmp_path: Path, np: int) -> None:
    out = call("raise", np, tmp_path)
    assert out.get("error") == "RunFunctionError", out
    assert out["rank"] == np - 1 and out["host"] and out["others"] == []
    assert (
        f"rank {np - 1} (host {out['host']}) raised ValueError: bad input on rank {np - 1}" in out["message"]
    )
    assert "in raise_on_last" in out["traceback"] and "run_rank.py" not in out["traceback"]
    assert out["traceback"].rstrip() in out["message"]


def test_a_rank_that_dies_without_a_result_is_named(tmp_path: Path) -> None:
    out = call("die", 2, tmp_path)
    assert out.get("error") == "RunFunctionError", out
    assert out["rank"] == 1 and out["traceback"] == ""
    assert (
        "rank 1 (host " in out["message"] and "exited with code 3 before returning a result" in out["message"]
    )


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_proc": 0}, "hpcring.run(num_proc=0): expected a whole number >= 1"),
        ({"np": 0}, "hpcring.run(num_proc=0)"),
        ({"num_proc": "2"}, "hpcring.run(num_proc='2')"),
        ({"hosts": "node1:two"}, "hpcring.run(hosts='node1:two'): "),
        ({"hosts": "node1:2,,node2"}, "expected 'host1:2,host2:4'"),
        ({"hosts": ["node1"]}, "hpcring.run(hosts=['node1']): expected a string"),
        ({"hosts": "a:1", "hostfile": "h"}, "either hosts or hostfile"),
        ({"use_gloo": True}, "use_gloo=True): hpcring runs over MPI only"),
        ({"use_mpi": False}, "use_mpi=False"),
        ({"cooldown_range": 5}, "expected (min_seconds, max_seconds)"),
        ({"env": {"A": 1}}, "env=...): expected a dict of str to str"),
        ({"start_timeout": 0}, "hpcring.run(start_timeout=0): expected a positive number of seconds"),
        ({"hostfile": "/nonexistent/hosts"}, "hostfile '/nonexistent/hosts' cannot be read"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, Any], words: str) -> None:
    with (
        pytest.warns(DeprecationWarning) if "np" in kwargs else _no_warning(),
        pytest.raises(ConfigError) as err,
    ):
        hpcring.run(abs, args=(1,), **kwargs)
    assert words in str(err.value)


def _no_warning() -> Any:
    import contextlib

    return contextlib.nullcontext()


def test_horovod_in_env_refuses_when_a_real_horovod_is_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`env={"HPCRING_HOROVOD": "1"}` is `hpcring run --horovod`: refused before anything starts."""
    pkg = tmp_path / "site" / "horovod"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.28.1'\n")
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.delenv("HPCRING_HOROVOD", raising=False)
    marker = tmp_path / "started"
    with pytest.raises(ConfigError, match="a real Horovod is installed") as caught:
        hpcring.run(marker.touch, env={"HPCRING_HOROVOD": "1"})
    assert str(pkg) in str(caught.value) and not marker.exists()


def test_run_signature_is_horovods() -> None:
    import inspect

    params = inspect.signature(hpcring.run).parameters
    horovod = [
        "func", "args", "kwargs", "num_proc", "min_num_proc", "max_num_proc", "slots", "reset_limit",
        "cooldown_range", "hosts", "hostfile", "start_timeout", "ssh_port", "ssh_identity_file",
        "disable_cache", "output_filename", "verbose", "use_gloo", "use_mpi", "mpi_args", "network_interface",
        "executable", "np", "min_np", "max_np",
    ]  # fmt: skip
    assert list(params)[: len(horovod)] == horovod
    assert params["num_proc"].default == 1 and params["args"].default == ()
    assert all(params[p].default is None for p in horovod[4:])
    assert params["env"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_run_export_is_lazy() -> None:
    code = (
        "import sys, hpcring; f = hpcring.run; assert 'run' in hpcring.__all__; "
        "print(sorted(m for m in ('torch', 'mpi4py', 'cloudpickle', 'numpy') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
