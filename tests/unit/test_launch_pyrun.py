"""hpcring.launch.pyrun acts like plain `python` for scripts, -m and -c, and where the wrapper inserts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
