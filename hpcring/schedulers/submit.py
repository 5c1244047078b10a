"""Submitting a rendered script and waiting for the job: `sbatch --parsable` / `bsub` / `qsub` / `flux batch`,
then polling.

`sbatch --wait` polls only every ~10 s, so we poll `squeue` (then `scontrol show job` for the exit code),
`bjobs`, `qstat` or `flux jobs` ourselves, every `poll` seconds. Each scheduler's id parsing and state query
is registered by name in ID_PARSERS and STATES.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from hpcring.errors import SubmitError
from hpcring.schedulers import jobs_flux, jobs_pbs
from hpcring.schedulers.jobstate import JobResult, run

__all__ = ["JobResult", "submit", "wait"]

_LSF_ID = re.compile(r"Job <(\d+)> is submitted")


def submit(scheduler: str, argv: Sequence[str]) -> str:
    """Run the submit command and return the job id it printed."""
    res = run(argv)
    if res.returncode != 0:
        raise SubmitError(
            f"{argv[0]} refused the job (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
        )
    job_id = ID_PARSERS[scheduler](res.stdout)
    if job_id is None:
        raise SubmitError(f"{' '.join(argv[:-1])} printed no job id: {res.stdout.strip()!r}")
    return job_id


def slurm_id(stdout: str) -> str | None:
    """`sbatch --parsable`: `1234` or `1234;cluster`."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job_id = first.split(";")[0]
    return job_id if job_id.isdigit() else None


def lsf_id(stdout: str) -> str | None:
    """`bsub`: `Job <77> is submitted to queue <normal>.`"""
    m = _LSF_ID.search(stdout)
    return m.group(1) if m else None


# Job states in which a job has not yet ended (squeue may already have dropped it while it completes).
_SLURM_ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


def slurm_state(job_id: str) -> JobResult | None:
    """None while the job is queued or running; its final state and exit code once it has ended."""
    q = run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if q.returncode == 0 and q.stdout.strip():
        return None
    if q.returncode != 0 and "invalid job id" not in q.stderr.lower():
        return None  # the controller did not answer this time (busy, restarting): not a sign the job ended
    info = run(["scontrol", "show", "job", job_id]).stdout
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
    res = run(["bjobs", "-noheader", "-o", "stat exit_code", job_id])
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


ID_PARSERS: dict[str, Callable[[str], str | None]] = {
    "slurm": slurm_id,
    "lsf": lsf_id,
    "pbs": jobs_pbs.job_id,
    "flux": jobs_flux.job_id,
}
STATES: dict[str, Callable[[str], JobResult | None]] = {
    "slurm": slurm_state,
    "lsf": lsf_state,
    "pbs": jobs_pbs.state,
    "flux": jobs_flux.state,
}


def wait(scheduler: str, job_id: str, poll: float = 0.5, timeout: float | None = None) -> JobResult:
    """Poll until the job ends; its exit code is the job's (128+signal when killed)."""
    state = STATES[scheduler]
    start = time.monotonic()
    while True:
        result = state(job_id)
        if result is not None:
            return result
        if timeout is not None and time.monotonic() - start > timeout:
            raise SubmitError(f"job {job_id} still running after {timeout:.0f} s (it was left running)")
        time.sleep(poll)
