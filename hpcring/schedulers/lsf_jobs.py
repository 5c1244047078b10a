"""LSF job ids and states: `bsub` prints `Job <77> is submitted to queue <normal>.`; `bjobs -o "stat
exit_code"` gives DONE (exit 0) or EXIT with the job's exit code once it has ended."""

from __future__ import annotations

import re

from hpcring.errors import SubmitError
from hpcring.schedulers.jobstate import Active, JobResult, active, run

# bjobs' STAT words (LSF's "Job states") by phase; RUN and the rest count as running.
PHASES = {
    "PEND": "pending",
    "WAIT": "pending",
    "PSUSP": "suspended",
    "USUSP": "suspended",
    "SSUSP": "suspended",
}

_ID = re.compile(r"Job <(\d+)> is submitted")


def job_id(stdout: str) -> str | None:
    """The job id bsub printed."""
    m = _ID.search(stdout)
    return m.group(1) if m else None


def state(job_id: str) -> JobResult | Active | None:
    """Active while the job is pending or running; its final state and exit code once it has ended."""
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
    return active(stat, PHASES)
