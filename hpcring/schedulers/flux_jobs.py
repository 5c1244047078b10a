"""Flux job ids and states, as flux-core documents its commands.

`flux batch` prints the job id in F58 (`ƒ2Ek1ZUx5bq`; `f` instead of `ƒ` where the locale is not UTF-8).
`flux jobs -n -o "{state}|{result}|{returncode}" ID` lists a job by id whatever its state: while it is active
the result and return code are empty; once INACTIVE, result is COMPLETED, FAILED, CANCELED or TIMEOUT and
returncode the highest task exit code, minus the signal number when a job shell was killed, -128 when the job
was canceled before it started. (`flux job wait` only serves jobs submitted with `--flags=waitable`, by the
instance owner, so hpcring polls.)
"""

from __future__ import annotations

import re

from hpcring.errors import SubmitError
from hpcring.schedulers.jobstate import Active, JobResult, active, run

_ID = re.compile(r"^(?:[ƒf][1-9A-HJ-NP-Za-km-z]+|\d+)$")
FORMAT = "{state}|{result}|{returncode}"
CANCELED_BEFORE_START = -128
# `flux jobs` state names (flux-core's job states) by phase; RUN and CLEANUP count as running.
PHASES = {"NEW": "pending", "DEPEND": "pending", "PRIORITY": "pending", "SCHED": "pending"}


def job_id(stdout: str) -> str | None:
    """The job id flux batch printed."""
    for line in stdout.splitlines():
        if _ID.match(line.strip()):
            return line.strip()
    return None


def exit_code(result: str, returncode: int) -> int:
    """The job's exit code: 128 + signal when killed, 1 when it failed or was canceled without one."""
    if returncode == CANCELED_BEFORE_START:
        code = 1
    elif returncode < 0:
        code = 128 - returncode
    else:
        code = returncode
    return 1 if code == 0 and result != "COMPLETED" else code


def state(job_id: str) -> JobResult | Active | None:
    """Active while the job is pending or running; its result and exit code once it is INACTIVE; None when
    the instance did not answer this time."""
    res = run(["flux", "jobs", "-n", "-o", FORMAT, job_id])
    if res.returncode != 0:
        if "unknown" in res.stderr.lower() or "not found" in res.stderr.lower():
            raise SubmitError(
                f"job {job_id} is no longer known to Flux (flux jobs: {res.stderr.strip()}): it was purged "
                "from the job list before its end was seen; see the job's output file"
            )
        return None  # the instance did not answer this time: not a sign the job ended
    fields = res.stdout.strip().split("|")
    if len(fields) != 3:
        raise SubmitError(f"cannot read the state of job {job_id} from flux jobs: {res.stdout.strip()!r}")
    st, result, code = fields
    if st != "INACTIVE":
        return active(st, PHASES)
    try:
        returncode = int(code)
    except ValueError as exc:
        raise SubmitError(f"flux jobs gave job {job_id} no return code: {res.stdout.strip()!r}") from exc
    return JobResult(job_id, result or st, exit_code(result, returncode))
