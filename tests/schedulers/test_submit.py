"""`hpcring submit`: dry run, job id parsing, `--wait` exit codes, refusals.

sbatch/squeue/scontrol and bsub/bjobs are stand-ins here (shell scripts that run the job script with bash and
report its state the way the real tools print it); the real Slurm path is covered by tests/integration.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sched_helpers import cli

SBATCH = """#!/bin/bash
script="${@: -1}"
echo "$*" >> "$STATE/sbatch.args"
id=1234
echo RUNNING > "$STATE/$id"
( SLURM_JOB_NODELIST=node1 SLURM_JOB_ID=$id bash "$script" > "$STATE/$id.out" 2>&1; echo $? > "$STATE/$id.rc";
\
  echo DONE > "$STATE/$id" ) &
echo "$id;cluster"
"""
SQUEUE = """#!/bin/bash
id=${@: -3:1}
if [ "$(cat "$STATE/$id" 2>/dev/null)" = RUNNING ]; then echo RUNNING; fi
"""
SCONTROL = """#!/bin/bash
if [ "$2" = hostnames ]; then
  printf 'node%s\\n' $(seq 1 5000)
elif [ "$1" = show ]; then
  rc=$(cat "$STATE/$3.rc")
  if [ "$rc" = 0 ]; then st=COMPLETED; else st=FAILED; fi
  echo "JobId=$3 JobName=x"
  echo "   JobState=$st Reason=None Dependency=(null)"
  echo "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=$rc:0"
fi
"""
BSUB = """#!/bin/bash
echo "$*" >> "$STATE/bsub.args"
( LSB_JOBID=77 LSB_DJOB_HOSTFILE=/dev/null bash "$1" > "$STATE/77.out" 2>&1; echo $? > "$STATE/77.rc" ) &
echo "Job <77> is submitted to queue <normal>."
"""
BJOBS = """#!/bin/bash
if [ ! -e "$STATE/77.rc" ]; then echo "RUN -"; exit 0; fi
rc=$(cat "$STATE/77.rc")
if [ "$rc" = 0 ]; then echo "DONE -"; else echo "EXIT $rc"; fi
"""
LAUNCH = """#!/bin/bash
while [[ $1 == -* ]]; do case $1 in -n|--map-by|-ppn|-bind-to) shift;; esac; shift; done
exec "$@"
"""


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    for name, body in (
        ("sbatch", SBATCH),
        ("squeue", SQUEUE),
        ("scontrol", SCONTROL),
        ("bsub", BSUB),
        ("bjobs", BJOBS),
        ("srun", LAUNCH.replace("-*", "--*")),
        ("mpirun", LAUNCH),
    ):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}


def test_dry_run_shows_everything_and_submits_nothing(tools: dict[str, str], tmp_path: Path) -> None:
    res = cli(
        "submit",
        "--profile",
        "summit",
        "--account",
        "a",
        "--dry-run",
        "--script-dir",
        str(tmp_path / "jobs"),
        "--",
        "python",
        "t.py",
        env=tools,
    )
    assert res.returncode == 0, res.stderr
    assert "#BSUB -nnodes 1" in res.stdout and "jsrun --erf_input" in res.stdout
    assert "# file: " in res.stdout and "cpu_index_using: physical" in res.stdout
    assert "# would run: bsub " in res.stdout
    assert not (Path(tools["STATE"]) / "bsub.args").exists()
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize(("command", "code"), [("true", 0), ("exit 3", 3)])
def test_slurm_submit_wait_returns_the_job_exit_code(
    tools: dict[str, str], tmp_path: Path, command: str, code: int
) -> None:
    out = tmp_path / "job.sh"
    res = cli(
        "submit",
        "--profile",
        "generic-slurm-gpu",
        "--gpus-per-rank",
        "0",
        "--ranks-per-node",
        "1",
        "--wait",
        "--poll",
        "0.1",
        "-o",
        str(out),
        "--step",
        command,
        env=tools,
    )
    assert res.returncode == code, res.stderr
    assert res.stdout.splitlines()[0] == "1234"
    assert (Path(tools["STATE"]) / "sbatch.args").read_text().strip() == f"--parsable {out}"
    assert f"job 1234 ended: {'COMPLETED' if code == 0 else 'FAILED'}, exit code {code}" in res.stderr


def test_lsf_submit_wait(tools: dict[str, str], tmp_path: Path) -> None:
    res = cli(
        "submit",
        "--profile",
        "generic-lsf",
        "--nodes",
        "1",
        "--ranks-per-node",
        "1",
        "--wait",
        "--poll",
        "0.1",
        "--script-dir",
        str(tmp_path),
        "--job-name",
        "my job",
        "--step",
        "exit 5",
        env=tools,
    )
    assert res.returncode == 5, res.stderr
    assert res.stdout.splitlines()[0] == "77"
    (script,) = tmp_path.glob("my_job-*.sh")
    assert (Path(tools["STATE"]) / "bsub.args").read_text().strip() == str(
        script.absolute()
    )  # bsub script, no <


def test_submit_without_wait_prints_only_the_id(tools: dict[str, str], tmp_path: Path) -> None:
    res = cli("submit", "--profile", "generic-lsf", "--script-dir", str(tmp_path), "--", "true", env=tools)
    assert res.returncode == 0 and res.stdout == "77\n"


def test_submit_refused(tools: dict[str, str], tmp_path: Path) -> None:
    bad = Path(tools["PATH"].split(":")[0]) / "sbatch"
    bad.write_text(
        "#!/bin/bash\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1\n"
    )
    res = cli(
        "submit", "--profile", "generic-slurm-gpu", "--script-dir", str(tmp_path), "--", "true", env=tools
    )
    assert res.returncode == 1
    assert (
        "sbatch refused the job (exit 1): sbatch: error: Batch job submission failed: Invalid account"
        in res.stderr
    )
    assert "Traceback" not in res.stderr


def test_submit_without_scheduler_on_path(tmp_path: Path) -> None:
    res = cli(
        "submit",
        "--profile",
        "generic-lsf",
        "--script-dir",
        str(tmp_path),
        "--",
        "true",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 1 and "bsub not found on PATH" in res.stderr
