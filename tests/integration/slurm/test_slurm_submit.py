"""`hpcring submit` end to end on a real sbatch: it prints the job id; `--wait` returns the job's exit code.

Each rank runs a tiny shell command that leaves a file named after SLURM_PROCID, so the test also sees that
the submitted script ran every rank; a second job makes every rank exit 3 and `--wait` must return 3.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    NODES,
    PROFILES,
    Cluster,
    hpcring_cli,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration


def submit(tmp_path: Path, shell: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`hpcring submit --wait` of a shell command on every rank; returns the CLI result and the job id."""
    res = hpcring_cli(
        "submit",
        "--profile",
        str(PROFILES / "emulated-srun.yaml"),
        "--nodes",
        str(NODES),
        "--ranks-per-node",
        "2",
        "--job-name",
        "hpcring-submit-test",
        "--job-output",
        str(tmp_path / "job-%j.out"),
        "-o",
        str(tmp_path / "job.sh"),
        "--wait",
        "--wait-timeout",
        "120",
        "--",
        "bash",
        "-c",
        shell,
        timeout=150,
    )
    first = res.stdout.splitlines()[0] if res.stdout.strip() else ""
    assert first.isdigit(), (
        f"hpcring submit must print the job id first:\nstdout={res.stdout}\nstderr={res.stderr}"
    )
    return res, int(first)


def scontrol_job(job_id: int) -> dict[str, str]:
    out = subprocess.run(
        ["timeout", "30", "scontrol", "show", "job", str(job_id)], capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_submit_prints_job_id_and_waits(slurm_cluster: Cluster, tmp_path: Path) -> None:
    res, job_id = submit(tmp_path, f'touch {tmp_path}/ran-"$SLURM_PROCID"')
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    info = scontrol_job(job_id)
    assert info["JobName"] == "hpcring-submit-test" and info["JobState"] == "COMPLETED", info
    assert info["NumNodes"] == str(NODES)
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == [f"ran-{r}" for r in range(NODES * 2)]
    assert (tmp_path / f"job-{job_id}.out").exists(), "the job's output file is where --output said"


def test_submit_wait_returns_the_jobs_exit_code(slurm_cluster: Cluster, tmp_path: Path) -> None:
    res, job_id = submit(tmp_path, "exit 3")
    assert res.returncode == 3, f"--wait returned {res.returncode}:\n{res.stdout}\n{res.stderr}"
    info = scontrol_job(job_id)
    assert info["JobState"] == "FAILED" and info["ExitCode"].startswith("3:"), info


def test_submit_dry_run_submits_nothing(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """--dry-run shows the script and the sbatch command, and the scheduler never hears of the job."""
    before = subprocess.run(
        ["timeout", "30", "squeue", "-h"], capture_output=True, text=True, check=True
    ).stdout
    res = hpcring_cli(
        "submit",
        "--profile",
        str(PROFILES / "emulated-srun.yaml"),
        "--nodes",
        str(NODES),
        "--ranks-per-node",
        "2",
        "--job-name",
        "hpcring-dry-run",
        "-o",
        str(tmp_path / "job.sh"),
        "--dry-run",
        "--",
        "true",
    )
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --nodes=2" in res.stdout and "would run: sbatch" in res.stdout, res.stdout
    assert not (tmp_path / "job.sh").exists()
    after = subprocess.run(
        ["timeout", "30", "squeue", "-h"], capture_output=True, text=True, check=True
    ).stdout
    assert before == after == ""
    jobs = subprocess.run(
        ["timeout", "30", "scontrol", "show", "jobs"], capture_output=True, text=True
    ).stdout
    assert "hpcring-dry-run" not in jobs
