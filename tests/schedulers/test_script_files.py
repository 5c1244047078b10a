"""Files a generated script writes for itself (the PBS GPU wrapper in the job's working directory, the LSF
ERF and the Open MPI rankfile under $TMPDIR) exist while the launcher runs and are gone when the script ends:
after a clean end, after a failing step and after the SIGTERM a scheduler sends at the walltime. Files shipped
next to the script (`--files-dir`) are the user's and stay.

The scripts run under bash with a stand-in launcher that records which of those files it could read."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sched_helpers import make_plan, render_plan

from hpcring.schedulers import mapping, plan, planner, profile
from hpcring.schedulers.job import JobSpec, Step

# The launcher stand-in: notes each path in its arguments (`--erf_input=P`, `rankfile:FILE=P:...`) naming
# one of hpcring's per-job files that exists now, then ends as told: exit STANDIN_RC, or wait to be
# signalled after touching STANDIN_READY.
LAUNCHER = r"""#!/bin/bash
for w in "$@"; do
  printf '%s\n' "$w" | grep -oE '/[^:=]*hpcring-[^:=]*' | while read -r p; do
    if [ -f "$p" ]; then printf '%s\n' "$p" >> "$SEEN"; fi
  done
done
if [ -n "${STANDIN_READY:-}" ]; then
  : > "$STANDIN_READY"
  sleep 60
fi
exit "${STANDIN_RC:-0}"
"""

CASES = [
    ("generic-pbs", "mpiexec"),  # the GPU wrapper, in the job's working directory (every node reads it)
    ("polaris", "mpiexec"),
    ("generic-lsf", "jsrun"),  # the ERF, under $TMPDIR
    ("generic-lsf", "mpirun"),  # an Open MPI rankfile under LSF
    ("generic-slurm-gpu", "mpirun"),  # an Open MPI rankfile under Slurm
]


def _plan(name: str, launcher: str, options: plan.RenderOptions | None = None) -> plan.Plan:
    spec = JobSpec(nodes=1, account="acct", steps=(Step(("python3", "train.py")),))
    return planner.build(mapping.build(profile.load(name), spec), spec, options, launcher_name=launcher)


def _env(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "jsrun", "mpirun", "mpiexec"):
        (bin_dir / tool).write_text(LAUNCHER)
        (bin_dir / tool).chmod(0o755)
    for tool, body in (("scontrol", "echo node1"), ("module", "true")):
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    (tmp / "hosts").write_text("batch1\nh1\n")
    (tmp / "pbs-nodes").write_text("node1\n")
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SEEN": str(tmp / "seen"),
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_ID": "42",
        "LSB_JOBID": "42",
        "LSB_DJOB_HOSTFILE": str(tmp / "hosts"),
        "PBS_NODEFILE": str(tmp / "pbs-nodes"),
        "PBS_JOBID": "42.pbs",
        "PBS_O_WORKDIR": str(tmp),
        "TMPDIR": str(tmp),
        "HOME": str(tmp),
    }


def _left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(("hpcring-", ".hpcring-")))


def _seen(tmp: Path) -> list[str]:
    seen = tmp / "seen"
    return sorted(set(seen.read_text().split())) if seen.exists() else []


@pytest.mark.parametrize(("name", "launcher"), CASES)
@pytest.mark.parametrize("rc", [0, 3])
def test_written_files_are_removed_at_the_end(name: str, launcher: str, rc: int, tmp_path: Path) -> None:
    p = _plan(name, launcher)
    assert p.inline_files, "this case must write a file of its own"
    script = tmp_path / "job.sh"
    script.write_text(render_plan(p))
    env = _env(tmp_path) | {"STANDIN_RC": str(rc)}
    res = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == rc, res.stderr
    # The launcher read every file the script wrote for it, and none is left.
    assert len(_seen(tmp_path)) == len(p.inline_files), _seen(tmp_path)
    assert _left(tmp_path) == []


@pytest.mark.parametrize(("name", "launcher"), CASES[:3:2])
def test_written_files_are_removed_when_the_scheduler_signals_the_job(
    name: str, launcher: str, tmp_path: Path
) -> None:
    """PBS, Slurm and LSF end a job at its walltime with SIGTERM to the job's processes."""
    p = _plan(name, launcher)
    script = tmp_path / "job.sh"
    script.write_text(render_plan(p))
    ready = tmp_path / "ready"
    env = _env(tmp_path) | {"STANDIN_READY": str(ready)}
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "the script ended before its step started"
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        assert _left(tmp_path) != []
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    assert _left(tmp_path) == []


def test_shipped_files_stay(tmp_path: Path) -> None:
    """`--files-dir`: the file is written next to the script at render time, is the user's, and no trap
    removes it."""
    p = _plan("generic-lsf", "jsrun", plan.RenderOptions(files_dir=str(tmp_path), basename="job"))
    assert p.files and not p.inline_files
    assert "trap " not in render_plan(p)


def test_no_trap_without_files() -> None:
    assert "trap " not in render_plan(make_plan("generic-flux", nodes=1, command=("true",)))
