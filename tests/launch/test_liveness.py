"""Heartbeats and the dead-man switch on one machine (issue 27; the fake-cluster tests cut real links:
tests/integration/netns/test_partition.py).

At `--collective-timeout 4` the silence timeout is 2 s. A rank stopped by SIGSTOP is ended by its wrapper and
named by the launcher; a launcher that freezes (SIGSTOP) is given up by every wrapper, which ends its rank and
the MPI launcher that started it, so nothing of the job is left running while the launcher cannot act.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from job_processes import children
from support import ROOT, flavour_python
from test_run import PROGRAM, alive, assert_no_orphans
from test_secrets import wait_ready

from hpcring.launch import liveness

TIMEOUT = ["--collective-timeout", "4"]


def start(flavour: str, directory: Path) -> subprocess.Popen[str]:
    py = flavour_python(flavour)
    argv = [py, "-m", "hpcring", "run", "-np", "2", "--mpi", flavour, *TIMEOUT, "--", py, PROGRAM, "wait"]
    return subprocess.Popen(
        ["timeout", "-k", "5", "120", *argv, str(directory)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rank_pid(directory: Path, rank: int) -> int:
    return int((directory / f"{rank}.pids").read_text().split()[0])


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_a_stopped_rank_is_ended_and_named(tmp_path: Path, flavour: str) -> None:
    proc = start(flavour, tmp_path)
    try:
        wait_ready(proc, 2)
        stopped_at = time.monotonic()
        os.kill(rank_pid(tmp_path, 1), signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    host = socket.gethostname()
    assert f"hpcring run: rank 1 on {host} was stopped (SIGSTOP) for 2 s; ending the other ranks" in err, err
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 30, f"{took:.1f} s from SIGSTOP to the end (silence timeout 2 s; hang guard)"
    assert_no_orphans(tmp_path, 2)


def test_a_frozen_launcher_trips_every_dead_man_switch(tmp_path: Path) -> None:
    """SIGSTOP on `hpcring run`: 2 s later its wrappers end their ranks and prterun, with nobody to tell
    them; once resumed, the launcher finds its node silent and exits non-zero naming it."""
    proc = start("openmpi", tmp_path)
    try:
        wait_ready(proc, 2)
        (launcher,) = children(proc.pid)
        (mpiexec,) = children(launcher)
        os.kill(launcher, signal.SIGSTOP)
        try:
            pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()] + [mpiexec]
            deadline = time.monotonic() + 30
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = [p for p in pids if alive(p)]
        finally:
            os.kill(launcher, signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    assert not left, f"still running while the launcher was frozen: {left}\n{err}"
    assert "the launcher was not heard from for 2 s; ending the rank" in err, err
    assert f"hpcring run: node {socket.gethostname()} (ranks 0,1) not heard from for" in err, err
    assert proc.returncode == 1, err


def test_silence_timeout_is_half_the_collective_timeout() -> None:
    var = "HPCRING_COLLECTIVE_TIMEOUT"
    assert liveness.silence_timeout({}, {}) == 150.0  # the default 300 s
    assert liveness.silence_timeout({var: "20"}, {var: "60"}) == 10.0  # the flag's setting wins
    assert liveness.silence_timeout({}, {var: "60"}) == 30.0
    assert liveness.silence_timeout({var: "0"}, {}) == 0.0  # off
    assert liveness.heartbeat_interval(10.0) == 2.0
    assert liveness.heartbeat_interval(150.0) == 5.0 and liveness.heartbeat_interval(0.5) == 0.2


def test_lost_nodes_are_named_with_their_ranks() -> None:
    text = liveness.lost_nodes_text({"n3": [5, 4], "n2": [1]}, 10)
    assert text == "node n2 (rank 1); node n3 (ranks 4,5) not heard from for 10 s"


def test_only_a_signal_stop_counts_as_stopped() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert not liveness.is_stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not liveness.is_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert liveness.is_stopped(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not liveness.is_stopped(child.pid)  # gone
