"""Submitting a rendered script and waiting for the job: `sbatch --parsable` / `bsub`, then polling.

`sbatch --wait` polls only every ~10 s, so we poll `squeue` (then `scontrol show job` for the exit code) or
`bjobs` ourselves, every `poll` seconds.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hpcring.errors import SubmitError

_LSF_ID = re.compile(r"Job <(\d+)> is submitted")


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: str
    exit_code: int


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise SubmitError(f"{argv[0]} not found on PATH: is this a {argv[0]} login node?") from exc
    except subprocess.TimeoutExpired as exc:
        raise SubmitError(f"{argv[0]} did not answer within {timeout:.0f} s") from exc


def submit(scheduler: str, argv: Sequence[str]) -> str:
    """Run the submit command and return the job id it printed."""
    res = _run(argv)
    if res.returncode != 0:
        raise SubmitError(
            f"{argv[0]} refused the job (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
        )
    if scheduler == "slurm":
        first = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
        job_id = first.split(";")[0]
        if not job_id.isdigit():
            raise SubmitError(f"sbatch printed no job id: {res.stdout.strip()!r}")
        return job_id
    m = _LSF_ID.search(res.stdout)
    if not m:
        raise SubmitError(f"bsub printed no job id: {res.stdout.strip()!r}")
    return m.group(1)


# Job states in which a job has not yet ended (squeue may already have dropped it while it completes).
_SLURM_ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


def slurm_state(job_id: str) -> JobResult | None:
    """None while the job is queued or running; its final state and exit code once it has ended."""
    q = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if q.returncode == 0 and q.stdout.strip():
        return None
    if q.returncode != 0 and "invalid job id" not in q.stderr.lower():
        return None  # the controller did not answer this time (busy, restarting): not a sign the job ended
    info = _run(["scontrol", "show", "job", job_id]).stdout
    state = re.search(r"JobState=(\w+)", info)
    if state is not None and state.group(1) in _SLURM_ACTIVE:
        return None
    code = re.search(r"\bExitCode=(\d+):(\d+)", info)
    if state is None or code is None:
        raise SubmitError(f"cannot read the state of job {job_id} from scontrol: {info.strip()[:200]!r}")
    rc, sig = int(code.group(1)), int(code.group(2))
    exit_code = 128 + sig if sig else rc
    if state.group(1) != "COMPLETED" and exit_code == 0:
        exit_code = 1
    return JobResult(job_id, state.group(1), exit_code)


def lsf_state(job_id: str) -> JobResult | None:
    """As slurm_state, from `bjobs -o "stat exit_code"` (DONE = 0, EXIT = its exit code)."""
    res = _run(["bjobs", "-noheader", "-o", "stat exit_code", job_id])
    fields = res.stdout.split()
    if not fields:
        raise SubmitError(f"bjobs knows no job {job_id}: {res.stderr.strip()}")
    stat = fields[0]
    if stat == "DONE":
        return JobResult(job_id, stat, 0)
    if stat == "EXIT":
        code = fields[1] if len(fields) > 1 and fields[1].isdigit() else "1"
        return JobResult(job_id, stat, int(code) or 1)
    return None


def wait(scheduler: str, job_id: str, poll: float = 0.5, timeout: float | None = None) -> JobResult:
    """Poll until the job ends; its exit code is the job's (128+signal when killed)."""
    state = slurm_state if scheduler == "slurm" else lsf_state
    start = time.monotonic()
    while True:
        result = state(job_id)
        if result is not None:
            return result
        if timeout is not None and time.monotonic() - start > timeout:
            raise SubmitError(f"job {job_id} still running after {timeout:.0f} s (it was left running)")
        time.sleep(poll)
