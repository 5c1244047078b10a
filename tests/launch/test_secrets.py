"""The job's secret stays off command lines (issue 27, item 6).

`ps` shows every process's argv to every user of a node, so a token there lets a stranger who races a wrapper
to the control port pose as a rank. While a real job runs (np 2, Open MPI and MPICH) the test takes the
token from where the launcher put it (mpiexec's environment), checks that it is the one the wrappers were
started with and that the ranks do not inherit it, and reads the argv of every process on the machine: none
may carry it. tests/integration/netns/test_partition.py does the same across two fake nodes, where the MPI
launcher's remote daemons (prted, hydra_pmi_proxy) are started through an ssh stand-in.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from job_processes import check_secret, children
from support import ROOT, flavour_python

from hpcring.launch.protocol import TOKEN_VARIABLE

PROGRAM = str(Path(__file__).with_name("rank_program.py"))


def wait_ready(proc: subprocess.Popen[str], np: int) -> None:
    """Read the launcher's stdout until every rank said `ready`."""
    assert proc.stdout is not None
    ready = 0
    for line in proc.stdout:
        ready += line.endswith("ready\n")
        if ready == np:
            return
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"only {ready} of {np} ranks became ready; stderr: {err}")


def rank_pids(directory: Path) -> list[int]:
    """The rank processes' pids that rank_program.py's `wait` mode recorded (first of each line)."""
    return [int(f.read_text().split()[0]) for f in sorted(directory.glob("*.pids"))]


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_job_secret_is_on_no_command_line(tmp_path: Path, flavour: str) -> None:
    py = flavour_python(flavour)
    np = 2
    argv = [py, "-m", "hpcring", "run", "-np", str(np), "--mpi", flavour, "--", py, PROGRAM, "wait"]
    proc = subprocess.Popen(
        ["timeout", "-k", "5", "120", *argv, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(proc, np)
        (launcher,) = children(proc.pid)
        check_secret(launcher, np, rank_pids(tmp_path), str(tmp_path))
        os.kill(launcher, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err
    finally:
        if proc.poll() is None:  # a check failed: end the job (timeout passes SIGTERM on), its pipes close
            proc.terminate()
            proc.communicate(timeout=60)


def test_dry_run_names_the_token_variable_only() -> None:
    """What `--dry-run` prints is what would run: the variable's name for Open MPI, never a value."""
    out = subprocess.run(
        [sys.executable, "-m", "hpcring", "run", "-np", "2", "--dry-run", "--", "true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"-x {TOKEN_VARIABLE}" in out
    assert "--token" not in out and not re.search(r"[0-9a-f]{32}", out), out
