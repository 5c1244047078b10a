"""Heartbeats and the dead-man switch on one machine (issue 27; the fake-cluster tests cut real links:
tests/integration/netns/test_partition.py).

At `--collective-timeout 4` the silence timeout is 2 s. A rank stopped by SIGSTOP is ended by its wrapper and
named by the launcher; a launcher that freezes (SIGSTOP) is given up by every wrapper, which ends its rank and
the MPI launcher that started it, so nothing of the job is left running while the launcher cannot act.
"""

from __future__ import annotations

import io
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

from hpcring.launch import liveness, protocol
from hpcring.launch.command import LaunchSpec
from hpcring.launch.flavour import MpiInstall
from hpcring.launch.supervisor import Conn, Supervisor

TIMEOUT = ["--collective-timeout", "4"]


def start(flavour: str, directory: Path, mode: str = "wait") -> subprocess.Popen[str]:
    py = flavour_python(flavour)
    argv = [py, "-m", "hpcring", "run", "-np", "2", "--mpi", flavour, *TIMEOUT, "--", py, PROGRAM, mode]
    return subprocess.Popen(
        ["timeout", "-k", "5", "120", *argv, str(directory)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until_ready(proc: subprocess.Popen[str], np: int) -> str:
    """The launcher's stdout until every rank said `ready` (what was read, to be kept)."""
    assert proc.stdout is not None
    lines: list[str] = []
    while sum(line.endswith("ready\n") for line in lines) < np:
        line = proc.stdout.readline()
        assert line, f"the job ended before {np} ranks were ready: {''.join(lines)}"
        lines.append(line)
    return "".join(lines)


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


@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_a_frozen_launcher_trips_every_dead_man_switch(tmp_path: Path, flavour: str) -> None:
    """SIGSTOP on `hpcring run` for 5 s (the silence timeout is 2 s): its wrappers end their ranks and the
    MPI launcher, with nobody to tell them; once resumed, the launcher blames itself, not its node, and
    prints every line the ranks wrote, those written while it was stopped included (issue 35)."""
    proc = start(flavour, tmp_path, "tick")
    try:
        early = read_until_ready(proc, 2)
        (launcher,) = children(proc.pid)
        (mpiexec,) = children(launcher)
        os.kill(launcher, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()] + [mpiexec]
            deadline = time.monotonic() + 30
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = [p for p in pids if alive(p)]
            time.sleep(max(0.0, stopped_at + 5 - time.monotonic()))
        finally:
            os.kill(launcher, signal.SIGCONT)
        # Not communicate(): it reads the pipe's descriptor, skipping what readline() already buffered.
        assert proc.stdout is not None and proc.stderr is not None
        out, err = early + proc.stdout.read(), proc.stderr.read()  # the job's `timeout 120` bounds these
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    assert not left, f"still running while the launcher was frozen: {left}\n{err}"
    assert "the launcher was not heard from for 2 s; ending the rank" in err, err
    assert "not heard from for 2 s; ending the other ranks" not in err and "node " not in err, err
    assert "hpcring run: this launcher was not running for " in err, err
    assert "the rank wrappers gave it up and ended their ranks; ending the job" in err, err
    assert proc.returncode == 1, err
    for rank in range(2):
        written = (tmp_path / f"{rank}.ticks").read_text().splitlines()
        shown = [
            line.split(":", 1)[1] for line in out.splitlines() if line.startswith(f"[{rank}]<stdout>:tick")
        ]
        # The last line may have been printed but not yet logged when the rank was ended.
        assert len(written) > 15 and shown[: len(written)] == written, f"rank {rank}: {written} {shown} {err}"
        assert len(shown) <= len(written) + 1, out


def test_a_stop_before_a_read_is_judged_before_the_reports_it_carries() -> None:
    """The wrappers' reports that they gave the launcher up can arrive in the very read that follows the
    SIGSTOP (it landed while the loop handled an earlier event): the stop is judged first, so the job ends
    naming the launcher and the reports do not name their ranks as the cause."""
    err = io.BytesIO()
    sup = Supervisor(
        MpiInstall("openmpi", "/x/mpiexec", "mpiexec (Open MPI) 5.0.11"),
        LaunchSpec(np=2, command=("prog",), settings={"HPCRING_COLLECTIVE_TIMEOUT": "4"}),
        stderr=err,
        env={},
    )
    mine, wrappers = socket.socketpair()
    with mine, wrappers:
        conn = Conn(mine, rank=1, host="n1")
        sup.conns[1] = conn
        reason = "was ended by its wrapper: no word from the launcher for 2 s"
        report = {"code": 137, "signal": None, "reason": reason}
        wrappers.sendall(protocol.json_frame(protocol.EXITED, report))
        sup.ran_at = time.monotonic() - 5.0  # the loop last ran 5 s ago: it was stopped since
        sup._read(conn)
    sup.sel.close()
    said = err.getvalue().decode()
    assert "this launcher was not running for 5 s" in said and sup.failure is not None, said
    assert sup.failure[0] == -1 and "rank 1" not in said, (sup.failure, said)


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
