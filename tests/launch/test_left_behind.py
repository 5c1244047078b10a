"""Nothing of a job is left on the machine, however it ends (issue 35, item 4).

For each ending (success, a failed rank, SIGTERM and SIGKILL of the launcher) and each MPI flavour, a 2-rank
job initialises MPI (Open MPI's sm transport and MPICH's shared memory set up), records its pids and the
shared-memory files it maps, and ends. Afterwards: the launcher's TMPDIR (this test's own folder, so other
jobs on the machine do not count) holds nothing (no `ompi.*` session directory, no per-job directory), none
of the files the ranks mapped exists, and no process of the job is alive. A lost node is the fake-cluster
tests' case (tests/integration/netns/test_partition.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from job_processes import children, cmdlines, is_wrapper
from support import ROOT, flavour_python
from test_liveness import read_until_ready
from test_run import PROGRAM, alive

NP = 2
ENDINGS = {"success": 0, "failed-rank": 3, "sigterm": 128 + signal.SIGTERM, "sigkill": -signal.SIGKILL}


def job_processes(marker: str) -> list[int]:
    """Wrappers, MPI launchers and ranks whose command line names this test's folder."""
    return [pid for pid, line in cmdlines().items() if marker.encode() in line and pid != os.getpid()]


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_nothing_is_left_behind(tmp_path: Path, flavour: str, ending: str) -> None:
    py = flavour_python(flavour)
    tmpdir, ranks = tmp_path / "tmp", tmp_path / "ranks"
    tmpdir.mkdir()
    ranks.mkdir()
    how = {"success": "ok", "failed-rank": "fail"}.get(ending, "wait")
    argv = [py, "-m", "hpcring", "run", "-np", str(NP), "--mpi", flavour, "--", py, PROGRAM, "shm"]
    proc = subprocess.Popen(
        ["timeout", "-k", "5", "120", *argv, str(ranks), how],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        read_until_ready(proc, NP)
        (launcher,) = children(proc.pid)
        job = job_processes(str(ranks))
        assert any(is_wrapper(cmdlines().get(p, b"")) for p in job), job
        if ending in ("sigterm", "sigkill"):
            os.kill(launcher, signal.SIGTERM if ending == "sigterm" else signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    assert proc.returncode == ENDINGS[ending], err
    pids = [int(p) for f in ranks.glob("*.pids") for p in f.read_text().split()] + job
    mapped = sorted({line for f in ranks.glob("*.maps") for line in f.read_text().splitlines()})
    assert any("/dev/shm/" in p for p in mapped), f"the ranks mapped no shared memory: {mapped}"
    deadline = time.monotonic() + 20  # a dead launcher's wrappers clean up within seconds
    while time.monotonic() < deadline and (
        any(alive(p) for p in pids) or any(tmpdir.iterdir()) or any(os.path.exists(p) for p in mapped)
    ):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], f"processes outlived the job: {pids}\n{err}"
    assert not list(tmpdir.iterdir()), f"left in TMPDIR: {list(tmpdir.rglob('*'))}"
    left = [p for p in mapped if os.path.exists(p)]
    assert not left, f"shared memory left behind: {left}\n{err}"
    assert not [d for d in {os.path.dirname(p) for p in mapped} if "hpcring-job-" in d and os.path.exists(d)]
