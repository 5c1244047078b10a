"""Slurm job ids and states: `sbatch --parsable` prints the id; `squeue` lists a job until it ends, then
`scontrol show job` gives its state and exit code (`sbatch --wait` polls only every ~10 s)."""

from __future__ import annotations

import re

from hpcring.errors import SubmitError
from hpcring.schedulers.jobstate import Active, JobResult, active, run

# Job states in which a job has not yet ended (squeue may already have dropped it while it completes).
_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
# squeue's %T words (Slurm's "JOB STATE CODES") by phase; the rest of _ACTIVE counts as running.
PHASES = {"PENDING": "pending", "REQUEUED": "pending", "CONFIGURING": "pending", "SUSPENDED": "suspended"}


def job_id(stdout: str) -> str | None:
    """`sbatch --parsable`: `1234` or `1234;cluster`."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    found = first.split(";")[0]
    return found if found.isdigit() else None


def state(job_id: str) -> JobResult | Active | None:
    """Active while the job is queued or running; its final state and exit code once it has ended; None when
    the controller did not answer this time."""
    q = run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if q.returncode == 0 and q.stdout.strip():
        return active(q.stdout.split()[0], PHASES)
    if q.returncode != 0 and "invalid job id" not in q.stderr.lower():
        return None  # the controller did not answer this time (busy, restarting): not a sign the job ended
    info = run(["scontrol", "show", "job", job_id]).stdout
    job_state = re.search(r"JobState=(\w+)", info)
    if job_state is not None and job_state.group(1) in _ACTIVE:
        return active(job_state.group(1), PHASES)
    code = re.search(r"\bExitCode=(\d+):(\d+)", info)
    if job_state is None or code is None:
        raise SubmitError(f"cannot read the state of job {job_id} from scontrol: {info.strip()[:200]!r}")
    rc, sig = int(code.group(1)), int(code.group(2))
    exit_code = 128 + sig if sig else rc
    if job_state.group(1) != "COMPLETED" and exit_code == 0:
        exit_code = 1
    return JobResult(job_id, job_state.group(1), exit_code)
