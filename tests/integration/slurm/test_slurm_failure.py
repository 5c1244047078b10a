"""A rank killed mid-job: the job ends non-zero, the other ranks stop, and the log names the rank.

Rank 1 of 2 nodes x 2 ranks SIGKILLs itself after a first allreduce while the others keep reducing
(rank_report.py --kill-rank). Every rank wrote its pid first; once the job has ended, none may be alive, and
no survivor may have run into its 120 s hang guard. The job is a rendered script, as a user would submit it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from slurm_jobs import HERE, NODES, PROFILES, Cluster, hpcring_cli, python_for, sbatch

pytestmark = pytest.mark.integration

KILLED = 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("profile", ["emulated-srun", "emulated-mpirun"])
def test_killed_rank_ends_the_job(slurm_cluster: Cluster, tmp_path: Path, profile: str) -> None:
    py = python_for("mpich" if profile == "emulated-srun" else "openmpi")
    script = tmp_path / "job.sh"
    res = hpcring_cli(
        "render",
        "--profile",
        str(PROFILES / f"{profile}.yaml"),
        "--nodes",
        str(NODES),
        "--ranks-per-node",
        "2",
        "-o",
        str(script),
        "--",
        str(py),
        str(HERE / "rank_report.py"),
        str(tmp_path),
        "--kill-rank",
        str(KILLED),
    )
    assert res.returncode == 0, res.stderr
    job = sbatch(script, tmp_path / "job.out", timeout=150)
    ctx = f"job {job.job_id} ({job.state}, exit {job.exit_code}, {job.seconds:.1f} s):\n{job.output}"
    pids = {int(p.stem.split("-")[1]): int(p.read_text()) for p in tmp_path.glob("alive-*.pid")}
    assert sorted(pids) == list(range(NODES * 2)), f"not every rank got going: {pids}\n{ctx}"
    assert job.exit_code != 0 and job.state != "COMPLETED", ctx
    assert not list(tmp_path.glob("survived-*")), (
        f"ranks ran into the hang guard instead of being stopped\n{ctx}"
    )
    assert [r for r, pid in pids.items() if _alive(pid)] == [], ctx
    # The log names the dead rank (srun: "task 1: Killed"; Open MPI: "rank 1 ... signal 9").
    pattern = re.compile(rf"\b(task|rank)\s+{KILLED}\b.*\b(Killed|signal 9|SIGKILL)", re.IGNORECASE)
    assert any(pattern.search(line) for line in job.output.splitlines()), (
        f"the job's log does not say that rank {KILLED} was killed:\n{ctx}"
    )
