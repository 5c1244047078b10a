"""Every `hpcring` command whose reader goes away (`hpcring profiles list | head`) ends quietly, as tools
killed by SIGPIPE do: status 141 (128 + SIGPIPE), nothing on stderr, no traceback.

The pipe is real and its read end is closed before the command starts, so the first write fails however
small the output is (a reader that closes after some lines, as `head` does, races with the writer).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from hpcring.cli import CLOSED_PIPE_STATUS

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
COMMANDS = [
    ["profiles", "list"],
    ["profiles", "show", "frontier"],
    ["map", "--profile", "frontier", "--nodes", "2"],
    ["render", "--profile", "generic-pbs", "--nodes", "2", "--", "python", "train.py"],
    ["submit", "--profile", "generic-pbs", "--nodes", "2", "--dry-run", "--", "python", "train.py"],
    ["run", "-np", "2", "--dry-run", "--", "python", "train.py"],
]
# argparse prints help itself and drops a failed write (argparse._print_message): quiet, with its own status.
HELP = [(["render", "--help"], 0), ([], 2)]


def _into_a_closed_pipe(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    (cwd / "train.py").write_text("print('never run')\n")
    try:
        return subprocess.run(
            cmd, stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=cwd, env=ENV, timeout=120
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str], tmp_path: Path) -> None:
    proc = _into_a_closed_pipe([sys.executable, "-m", "hpcring", *argv], tmp_path)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == CLOSED_PIPE_STATUS, proc.returncode


@pytest.mark.parametrize(("argv", "status"), HELP, ids=[" ".join(a) or "no-args" for a, _ in HELP])
def test_help_into_a_closed_pipe_is_quiet(argv: list[str], status: int, tmp_path: Path) -> None:
    proc = _into_a_closed_pipe([sys.executable, "-m", "hpcring", *argv], tmp_path)
    assert (proc.stderr, proc.returncode) == ("", status)


def test_the_console_script_ends_quietly_too(tmp_path: Path) -> None:
    """The `hpcring` entry point, not `python -m hpcring`: the same status, nothing on stderr."""
    script = Path(sys.executable).parent / "hpcring"
    if not script.exists():
        pytest.skip(f"no hpcring console script next to {sys.executable}")
    proc = _into_a_closed_pipe([str(script), "profiles", "list"], tmp_path)
    assert (proc.stderr, proc.returncode) == ("", CLOSED_PIPE_STATUS)
