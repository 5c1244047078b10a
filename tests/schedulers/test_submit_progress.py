"""`hpcring submit --wait` on a terminal: a line at each change of the job's state, with the time in the last.

sbatch/squeue/scontrol are stand-ins (a job that is PENDING for a moment, then RUNNING, then ends), the way
the real tools print; stderr is a real pseudo-terminal, so the command decides for itself that a person reads.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcring.durations import duration

SBATCH = """#!/bin/bash
id=4321
echo PENDING > "$STATE/$id"
( sleep 0.6; echo RUNNING > "$STATE/$id"
  SLURM_JOB_NODELIST=node1 SLURM_JOB_ID=$id bash "${@: -1}" > "$STATE/$id.out" 2>&1; echo $? > "$STATE/$id.rc"
  echo DONE > "$STATE/$id" ) > /dev/null 2>&1 &
echo "$id"
"""
SQUEUE = """#!/bin/bash
st=$(cat "$STATE/4321")
if [ "$st" != DONE ]; then echo "$st"; fi
"""
SCONTROL = """#!/bin/bash
if [ "$2" = hostnames ]; then echo node1; exit 0; fi
rc=$(cat "$STATE/$3.rc")
if [ "$rc" = 0 ]; then st=COMPLETED; else st=FAILED; fi
echo "JobId=$3 JobState=$st ExitCode=$rc:0"
"""
LINE = re.compile(r"hpcring submit: job 4321 (\S+)(?: after ([0-9.]+) s (\S+))?\r?$")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    srun = '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n'
    for name, body in (("sbatch", SBATCH), ("squeue", SQUEUE), ("scontrol", SCONTROL), ("srun", srun)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HPCRING_")}
    return {**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}


def _submit(tmp_path: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "hpcring", "submit", "--profile", "generic-slurm-gpu"]
    argv += [
        "--gpus-per-rank",
        "0",
        "--ranks-per-node",
        "1",
        "--wait",
        "--poll",
        "0.1",
        "-o",
        str(tmp_path / "job.sh"),
        *extra,
    ]
    return [*argv, "--step", "sleep 0.5"]


def _on_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal; return the exit code, stdout and what the terminal showed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command ended and closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode(), shown.decode()


def test_terminal_shows_each_state_with_the_time_in_the_last(env: dict[str, str], tmp_path: Path) -> None:
    code, out, shown = _on_terminal(_submit(tmp_path), env)
    assert code == 0, shown
    assert out.splitlines() == ["4321"]
    lines = [m.groups() for m in map(LINE.match, shown.splitlines()) if m]
    assert [(state, prev) for state, _, prev in lines] == [
        ("pending", None),
        ("running", "pending"),
        ("COMPLETED", "running"),
    ], shown
    assert float(lines[1][1]) >= 0.3  # pending for the stand-in's 0.6 s, polled every 0.1 s
    assert float(lines[2][1]) >= 0.3  # the step sleeps 0.5 s
    assert "job 4321 ended: COMPLETED, exit code 0" in shown


def test_quiet_or_piped_shows_only_the_end(env: dict[str, str], tmp_path: Path) -> None:
    code, _, shown = _on_terminal(_submit(tmp_path, "--quiet"), env)
    assert code == 0
    assert not [line for line in shown.splitlines() if LINE.match(line)], shown
    piped = subprocess.run(_submit(tmp_path), capture_output=True, text=True, env=env, timeout=60)
    assert piped.returncode == 0
    assert piped.stderr.strip().splitlines() == ["hpcring submit: job 4321 ended: COMPLETED, exit code 0"]


@pytest.mark.parametrize(
    ("seconds", "text"), [(4.24, "4.2 s"), (187, "3 min 07 s"), (7500, "2 h 05 min"), (59.96, "60.0 s")]
)
def test_durations_read_at_their_scale(seconds: float, text: str) -> None:
    assert duration(seconds) == text
