"""hpcring.launch.pyrun acts like plain `python` for scripts, -m and -c, and where the wrapper inserts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcring.launch import report
from hpcring.launch.rankwrap import fail_fast_command
from hpcring.launch.supervisor import MpiOutput

PY = sys.executable
RUN = [PY, "-m", "hpcring.launch.pyrun"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["timeout", "60", *args], capture_output=True, text=True, cwd=cwd, check=False)


def test_script_argv_path_and_exit_code(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    script = tmp_path / "prog.py"
    script.write_text("import sys, helper_mod\nprint(sys.argv, helper_mod.VALUE, __name__)\nsys.exit(5)\n")
    plain, wrapped = run(PY, str(script), "a", "--b"), run(*RUN, str(script), "a", "--b")
    assert plain.returncode == wrapped.returncode == 5
    assert plain.stdout == wrapped.stdout == f"[{str(script)!r}, 'a', '--b'] 7 __main__\n"


def test_module_and_code(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nraise SystemExit('bye')\n")
    got = run(*RUN, "-m", "mymod", "x", cwd=tmp_path)
    assert (got.returncode, got.stdout, got.stderr) == (1, "__main__ ['x']\n", "bye\n")
    got = run(*RUN, "-c", "import sys; print(sys.argv); raise KeyError('k')", "y")
    assert got.returncode == 1 and got.stdout == "['-c', 'y']\n" and "KeyError: 'k'" in got.stderr


def test_without_mpi_errors_are_plain_python() -> None:
    got = run(*RUN, "-c", "raise ValueError('v')")
    assert got.returncode == 1 and got.stderr.rstrip().endswith("ValueError: v")


NESTED = """
import sys


def inner(x):
    return {}[x]


def outer():
    return inner("missing key")


if sys.argv[1:] == ["exit"]:
    sys.exit(3)
outer()
"""


def test_the_traceback_shows_the_user_frames_only(tmp_path: Path) -> None:
    """The runner's own frames (pyrun, runpy) are left out; the user's frames and the exception stay whole,
    for a script, a module and -c alike."""
    (tmp_path / "nested.py").write_text(NESTED)
    for target in (["nested.py"], ["-m", "nested"]):
        plain, got = run(PY, *target, cwd=tmp_path), run(*RUN, *target, cwd=tmp_path)
        assert got.returncode == 1, got.stderr
        lines = got.stderr.splitlines()
        assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "KeyError: 'missing key'"
        assert "pyrun" not in got.stderr and "runpy" not in got.stderr, got.stderr
        frames = [line.split(", in ")[1] for line in lines if line.startswith("  File ")]
        assert frames == ["<module>", "outer", "inner"], got.stderr
        # plain python prints the same (for -m, after its own runpy frames)
        assert plain.stderr.endswith(got.stderr.split("\n", 1)[1]), (plain.stderr, got.stderr)
    code = run(*RUN, "-c", "def f():\n    raise OSError(5, 'io')\nf()")
    frames = [line for line in code.stderr.splitlines() if line.startswith("  File ")]
    assert frames == ['  File "<string>", line 3, in <module>', '  File "<string>", line 2, in f'], (
        code.stderr
    )
    assert code.stderr.rstrip().endswith("OSError: [Errno 5] io")


def test_a_module_that_cannot_be_found_is_one_line(tmp_path: Path) -> None:
    got = run(*RUN, "-m", "no_such_module_here", cwd=tmp_path)
    assert got.returncode == 1
    assert "Traceback" not in got.stderr and "No module named no_such_module_here" in got.stderr


def report_of(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, dict]:
    """Run pyrun with a report pipe as the rank wrapper hands it; (exit status, the report or {})."""
    read_end, write_end = os.pipe()
    full_env = {**os.environ, **(env or {}), report.REPORT_FD: str(write_end)}
    proc = subprocess.Popen(
        [*RUN, *args], env=full_env, cwd=cwd, pass_fds=[write_end], stderr=subprocess.PIPE
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    proc.communicate(timeout=60)
    found = report.receive(data)
    return proc.returncode, found.to_json() if found else {}


def test_the_runner_reports_how_the_rank_failed(tmp_path: Path) -> None:
    (tmp_path / "nested.py").write_text(NESTED)
    status, got = report_of("nested.py", cwd=tmp_path)
    assert status == 1
    assert got["kind"] == "exception" and got["summary"] == "KeyError: 'missing key'"
    assert got["where"] == f"{tmp_path / 'nested.py'}:6 in inner" and got["committed"] is False
    assert got["text"].startswith("Traceback") and "pyrun" not in got["text"]
    status, got = report_of("nested.py", "exit", cwd=tmp_path, env={"HPCRING_ELASTIC_COMMITTED": "1"})
    assert status == 3
    assert (got["kind"], got["summary"], got["committed"]) == ("exit", "exit code 3", True)
    # success reports nothing, and the user's program never sees the pipe's variable
    status, got = report_of("-c", f"import os; assert {report.REPORT_FD!r} not in os.environ")
    assert (status, got) == (0, {})


def test_an_uncaught_collective_timeout_keeps_its_status() -> None:
    """With MPI initialised, an uncaught error exits at once with 1, or with the status a collective timeout
    asks for (the same one the watchdog would use), so `hpcring run` sees 70 either way."""
    code = "from mpi4py import MPI; from hpcring.errors import {0}; raise {0}('stuck')"
    got = run(*RUN, "-c", code.format("CollectiveTimeoutError"))
    assert got.returncode == 70 and "CollectiveTimeoutError: stuck" in got.stderr, got.stderr
    got = run(*RUN, "-c", code.format("CollectiveError"))
    assert got.returncode == 1 and "CollectiveError: stuck" in got.stderr, got.stderr


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ([PY, "train.py", "--lr", "1"], [PY, "-m", "hpcring.launch.pyrun", "train.py", "--lr", "1"]),
        (
            [PY, "-u", "-X", "dev", "-m", "pytest", "-q"],
            [PY, "-u", "-X", "dev", "-m", "hpcring.launch.pyrun", "-m", "pytest", "-q"],
        ),
        ([PY, "-c", "print(1)"], [PY, "-m", "hpcring.launch.pyrun", "-c", "print(1)"]),
        ([PY, "-m", "mpi4py", "train.py"], [PY, "-m", "mpi4py", "train.py"]),
        ([PY, "-"], [PY, "-"]),
        ([PY], [PY]),
        (["/usr/bin/env", "python3", "x.py"], ["/usr/bin/env", "python3", "x.py"]),
        (["/nonexistent/bin/python", "x.py"], ["/nonexistent/bin/python", "x.py"]),  # another environment
        (["sh", "-c", "python x.py"], ["sh", "-c", "python x.py"]),
    ],
)
def test_fail_fast_command(cmd: list[str], expected: list[str]) -> None:
    assert fail_fast_command(cmd) == expected


OMPI_BLOCK = (
    b"-" * 74 + b"\nprterun has exited due to process rank 2 with PID 1 on node vm exiting\nimproperly. "
    b"There are three reasons this could occur:\n" + b"-" * 74 + b"\n"
)


class Sink:
    def __init__(self) -> None:
        self.data = b""

    def write(self, b: bytes) -> int:
        self.data += b
        return len(b)

    def flush(self) -> None:
        pass


def test_mpiexec_noise_is_dropped_only_when_we_abort() -> None:
    sink, aborting = Sink(), [False]
    out = MpiOutput(sink, lambda: aborting[0])  # type: ignore[arg-type]
    out.feed(b"plain line\n" + OMPI_BLOCK[:50])
    out.feed(OMPI_BLOCK[50:])
    assert sink.data == b"plain line\n"  # the help block is held back briefly ...
    aborting[0] = True
    out.feed(b"", final=True)
    assert sink.data == b"plain line\n"  # ... and dropped once the launcher is ending the job itself
    other = Sink()
    kept = MpiOutput(other, lambda: False)  # type: ignore[arg-type]
    kept.feed(OMPI_BLOCK + b"A daemon failed\n", final=True)
    assert other.data == b"A daemon failed\n" + OMPI_BLOCK  # not aborting: shown (after the hold)
