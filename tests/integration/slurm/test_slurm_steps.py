"""A multi-step job (`steps:` list with barriers) really holds every rank at each step boundary.

The job file jobs/steps.yaml runs step_stamp.py three times on every rank of 2 nodes x 2 ranks; rank 0 is slow
in each step. From the wall-clock stamps the ranks wrote (all nodes are this host, so clocks agree): no rank
starts step k+1 before every rank ended step k. A rank failing step one fails the job and step two never runs.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    HERE,
    NODES,
    OMPI_PY,
    PROFILES,
    Cluster,
    Job,
    hpcring_cli,
    sbatch,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration

RANKS = NODES * 2
STEPS = ("one", "two", "three")


def run_steps(work: Path, fail_rank: int) -> tuple[Job, dict[str, list[dict[str, Any]]]]:
    """Render jobs/steps.yaml on the srun profile, run it, and collect the stamps per step."""
    script = work / "steps.sh"
    res = hpcring_cli(
        "render",
        "--profile",
        str(PROFILES / "emulated-srun.yaml"),
        "--job",
        str(HERE / "jobs" / "steps.yaml"),
        "--nodes",
        str(NODES),
        "--ranks-per-node",
        "2",
        "-o",
        str(script),
    )
    assert res.returncode == 0, f"hpcring render --job failed:\n{res.stderr}"
    env = {
        "STAMP_PY": str(OMPI_PY),
        "STAMP": str(HERE / "step_stamp.py"),
        "STAMP_DIR": str(work),
        "STAMP_FAIL_RANK": str(fail_rank),
    }
    job = sbatch(script, work / "steps.out", env=env, timeout=120)
    stamps: dict[str, list[dict[str, Any]]] = {s: [] for s in STEPS}
    for p in work.glob("*-rank-*.json"):
        stamp = json.loads(p.read_text())
        stamps[stamp["step"]].append(stamp)
    return job, stamps


def test_steps_are_separated_by_barriers(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job, stamps = run_steps(tmp_path, fail_rank=-1)
    script = (tmp_path / "steps.sh").read_text()
    ctx = f"job {job.job_id} ({job.state}, exit {job.exit_code}):\n{job.output}\n{script}"
    assert job.exit_code == 0 and job.state == "COMPLETED", ctx
    for step in STEPS:
        assert sorted(s["rank"] for s in stamps[step]) == list(range(RANKS)), (
            f"step {step}: {stamps[step]}\n{ctx}"
        )
    for before, after in itertools.pairwise(STEPS):
        last_end = max(s["end"] for s in stamps[before])
        first_start = min(s["start"] for s in stamps[after])
        # Rank 0 ends `before` ~1 s after the fast ranks: only a barrier keeps them from starting `after`.
        fast_end = min(s["end"] for s in stamps[before])
        assert last_end - fast_end > 0.4, "the slow rank must really lag, or this test proves nothing"
        assert first_start >= last_end, (
            f"step {after} started {last_end - first_start:.3f} s before {before} ended"
        )


def test_failed_step_stops_the_job(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Rank 2 fails step one: srun ends the step (--kill-on-bad-exit), the job fails, step two never runs."""
    job, stamps = run_steps(tmp_path, fail_rank=2)
    ctx = f"job {job.job_id} ({job.state}, exit {job.exit_code}):\n{job.output}"
    assert job.exit_code != 0 and job.state == "FAILED", ctx
    assert 2 in {s["rank"] for s in stamps["one"]}, ctx  # the failing rank did run its step
    assert stamps["two"] == [] and stamps["three"] == [], f"later steps ran after a failure: {stamps}\n{ctx}"
    flat = " ".join(job.output.split())
    assert re.search(r"task 2: Exited with exit code 5", flat), (
        f"the log does not name the failed rank:\n{ctx}"
    )
