"""Training past the wall clock under the real launcher: `hpcring run --checkpoint-dir` gets SIGUSR1 (a time
limit's warning) or SIGUSR2 (a preemption) mid-training, every rank checkpoints at its next commit and the job
exits with the requeue status; relaunched with the same directory it resumes, and the steps of all the jobs
are each done once with final weights equal to an uninterrupted run's (docs/guide/elastic.md).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from support import ROOT

from hpcring.contracts.wallclock import REQUEUE_EXIT_CODE, STOPPED_EXIT_CODE

HERE = Path(__file__).parent
PROGRAM = str(HERE / "train_program.py")
HOOK_PROGRAM = str(HERE / "wallclock_program.py")
STEP = re.compile(r"^\[(\d+)\]<stdout>:STEP (\d+) size=(\d+) t=(\S+)$")
NP = 2


def launch(
    flags: Sequence[str],
    program_args: Sequence[str],
    *,
    signum: int | None = None,
    at_step: int = 0,
    action: Callable[[], object] | None = None,
    env: dict[str, str] | None = None,
    program: str = PROGRAM,
    timeout: float = 240,
) -> tuple[int, str, str]:
    """`hpcring run` on NP ranks; with `signum`, that signal goes to the launcher once rank 0 printed STEP
    `at_step` (or, for the hook program, its READY line); `action` is called then instead. Returns (exit
    code, stdout, stderr)."""
    py = sys.executable
    argv = [py, "-m", "hpcring", "run", "-np", str(NP), *flags, "--", py, "-W", "ignore", program]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HPCRING_ELASTIC_DIR", None)
    proc = subprocess.Popen(
        [*argv, *program_args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    trigger = f"[0]<stdout>:STEP {at_step} " if at_step else "[0]<stdout>:READY"
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            lines.append(line)
            if (signum is not None or action is not None) and line.startswith(trigger):
                if action is not None:
                    action()
                elif signum is not None:
                    proc.send_signal(signum)
                signum = action = None
            if time.monotonic() > deadline:
                break
        err = proc.stderr.read()
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, "".join(lines), err


def steps_of(out: str) -> list[int]:
    """The steps rank 0 completed, in order."""
    return [int(m.group(2)) for line in out.splitlines() if (m := STEP.match(line)) and m.group(1) == "0"]


def test_a_warned_job_checkpoints_requeues_and_resumes_every_step_once(tmp_path: Path) -> None:
    """Job 1 gets SIGUSR1 at step 5: it stops at the commit of step 6 (commits every 2 steps) with exit 85.
    Job 2 resumes there and gets SIGUSR2 at step 15 with a preemption bound of 0: it checkpoints at step 16
    and exits 86 (bound reached). Job 3 resumes at 16 and finishes. Steps 1..24 ran once each, the final
    weights equal an uninterrupted run's, and each stop and resume said where it was."""
    work = ["--step-sleep", "0.15", "--commit-every", "2"]
    reference = tmp_path / "reference.pt"
    code, out, err = launch([], [*work, "--out", str(reference)])
    assert code == 0, err[-3000:]
    total = steps_of(out)
    assert total == list(range(1, len(total) + 1)) and len(total) == 24, total

    ckpt = tmp_path / "ckpt"
    final = tmp_path / "final.pt"
    flags = ["--checkpoint-dir", str(ckpt)]
    code1, out1, err1 = launch(flags, work, signum=signal.SIGUSR1, at_step=5)
    assert code1 == REQUEUE_EXIT_CODE, err1[-3000:]
    assert "hpcring run: received SIGUSR1; passing it to every rank" in err1
    assert "no checkpoint in" in err1
    stop1 = re.search(r"time limit warning: checkpoint of commit \d+ \(step (\d+)\) written to \S+ in", err1)
    assert stop1 is not None, err1[-3000:]
    assert "time limit requeue 1 of 3: exiting with 85" in err1
    code2, out2, err2 = launch(
        flags, work, signum=signal.SIGUSR2, at_step=15, env={"HPCRING_MAX_REQUEUES": "3,0"}
    )
    assert code2 == STOPPED_EXIT_CODE, err2[-3000:]
    resumed = r"resuming after requeue 1 \(1 for the time limit, 0 for preemption\) from commit \d+ "
    assert re.search(resumed + rf"\(step {stop1.group(1)}\)", err2), err2[-3000:]
    assert "steps lost: 0" in err2 and "RNG states restored" in err2
    assert "preemption requeues: 0 of 0 done, not requeuing (exit 86)" in err2
    code3, out3, err3 = launch(flags, [*work, "--out", str(final)])
    assert code3 == 0, err3[-3000:]
    assert "resuming after requeue 2 (1 for the time limit, 1 for preemption)" in err3

    first, second, third = steps_of(out1), steps_of(out2), steps_of(out3)
    assert first[-1] == int(stop1.group(1)) and first[-1] % 2 == 0 and first[-1] >= 6
    assert sorted(first + second + third) == total, (first, second, third)  # each step exactly once
    got, want = torch.load(final), torch.load(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    kept = [p for p in ckpt.iterdir() if p.name.startswith("checkpoint-")]  # the newest only, complete
    assert len(kept) == 1 and kept[0].name.endswith("-0002") and (kept[0] / "COMPLETE.json").is_file()


@pytest.mark.parametrize("signum", [signal.SIGUSR1])
def test_a_plain_script_gets_the_warning_through_its_hook(tmp_path: Path, signum: int) -> None:
    """No hvd.elastic: `hpcring.torch.on_wall_clock(fn)` is called on every rank with the kind, and the
    script's own exit with REQUEUE_EXIT_CODE makes the launcher's status 85 rather than a failure."""
    code, out, err = launch([], [], signum=signum, program=HOOK_PROGRAM, timeout=120)
    assert code == REQUEUE_EXIT_CODE, err[-3000:]
    warned = sorted(line for line in out.splitlines() if "WARNED" in line)
    assert warned == [f"[{r}]<stdout>:WARNED limit rank={r}" for r in range(NP)], out
    assert "exiting with 85 (requeue the job)" in err


def test_a_batch_scripts_warning_file_stops_the_ranks_at_a_commit(tmp_path: Path) -> None:
    """A rendered batch script's trap writes the warning's kind to WARNING in the checkpoint directory
    (tests/schedulers/test_requeue_render.py renders it): rank 0 sees it at the next commit, every rank
    checkpoints and leaves with 85, and `hpcring run` reports a requeue, not a failed rank."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    code, out, err = launch(
        ["--checkpoint-dir", str(ckpt)],
        ["--step-sleep", "0.15", "--commit-every", "2"],
        at_step=3,
        action=lambda: (ckpt / "WARNING").write_text("preempt\n"),
    )
    assert code == REQUEUE_EXIT_CODE, err[-3000:]
    stopped = re.search(r"preemption warning: checkpoint of commit \d+ \(step (\d+)\)", err)
    assert stopped is not None and int(stopped.group(1)) in (4, 6), err[-3000:]
    assert steps_of(out)[-1] == int(stopped.group(1))
    assert "ending the other ranks" not in err and "exiting with 85 (requeue the job)" in err
