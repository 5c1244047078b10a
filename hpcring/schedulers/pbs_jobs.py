"""PBS job ids and states, as PBS Pro documents its commands.

`qsub` prints the job id (`1234.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov`; array jobs `1234[].server`).
`qstat -x -f -F json ID` (PBS Pro 19 and later) gives `job_state` and, once the job finished (`F`, kept in the
server's job history), `Exit_status`; servers without JSON output get the same fields from `qstat -x -f ID`.
Exit_status is the script's exit code, 256 + the signal when PBS Pro killed it, and negative when PBS could
not run the job at all (its JOB_EXEC_* codes).
"""

from __future__ import annotations

import json
import re

from hpcring.errors import SubmitError
from hpcring.schedulers.jobstate import Active, JobResult, active, run

_ID = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9_.-]+)?$")
_FIELD = re.compile(r"^\s*(job_state|Exit_status)\s*=\s*(\S+)", re.MULTILINE)
ENDED = frozenset({"F", "X"})  # finished (job history), an array subjob that expired
# job_state letters (PBS Pro's "Job States") by phase; R, E (exiting), B (array begun) count as running.
PHASES = {
    "Q": "pending",
    "H": "pending",
    "W": "pending",
    "T": "pending",
    "M": "pending",
    "S": "suspended",
    "U": "suspended",
}
# qstat's words for a job id the server no longer (or never) knew (it then exits 153, PBSE_UNKJOBID).
_UNKNOWN = ("unknown job id", "job has finished")
# What a qstat without `-F json` (older PBS Pro, Torque) says about the option.
_NO_JSON = ("invalid option", "illegal option", "unrecognized option", "usage")


def job_id(stdout: str) -> str | None:
    """The job id qsub printed (its first line of that form)."""
    for line in stdout.splitlines():
        if _ID.match(line.strip()):
            return line.strip()
    return None


def exit_code(status: int) -> int:
    """The job's exit code from Exit_status: 128 + signal for killed jobs (as a shell reports them), 1 when
    PBS could not run it."""
    if status < 0:
        return 1
    if status >= 256:
        return 128 + status - 256
    return status


def _result(job_id: str, fields: dict[str, str]) -> JobResult | Active:
    state = fields.get("job_state", "")
    if state not in ENDED:
        return active(state, PHASES)
    raw = fields.get("Exit_status")
    if raw is None or not raw.lstrip("-").isdigit():
        # Deleted before it ran: PBS records no exit status.
        return JobResult(job_id, state, 1)
    return JobResult(job_id, state, exit_code(int(raw)))


def _from_json(job_id: str, text: str) -> dict[str, str]:
    try:
        jobs = json.loads(text).get("Jobs", {})
    except (ValueError, AttributeError) as exc:
        raise SubmitError(f"qstat -F json printed no JSON for job {job_id}: {text.strip()[:200]!r}") from exc
    info = jobs.get(job_id) or (next(iter(jobs.values())) if len(jobs) == 1 else None)
    if not isinstance(info, dict):
        raise SubmitError(f"qstat does not list job {job_id}: {text.strip()[:200]!r}")
    return {k: str(info[k]) for k in ("job_state", "Exit_status") if k in info}


def _vanished(job_id: str, stderr: str) -> SubmitError:
    return SubmitError(
        f"job {job_id} left the PBS queue without a recorded exit status (qstat: {stderr.strip()}); the "
        "server keeps no job history (job_history_enable) or already purged it: see the job's output file"
    )


def state(job_id: str) -> JobResult | Active | None:
    """Active while the job is queued or running; its final state and exit code once it has ended; None when
    the server did not answer this time."""
    res = run(["qstat", "-x", "-f", "-F", "json", job_id])
    if res.returncode == 0:
        return _result(job_id, _from_json(job_id, res.stdout))
    if any(word in res.stderr.lower() for word in _UNKNOWN):
        raise _vanished(job_id, res.stderr)
    if not any(word in res.stderr.lower() for word in _NO_JSON):
        return None  # the server did not answer this time: not a sign the job ended
    text = run(["qstat", "-x", "-f", job_id])  # a qstat without JSON output: the same fields as text
    if text.returncode != 0:
        if any(word in text.stderr.lower() for word in _UNKNOWN):
            raise _vanished(job_id, text.stderr)
        return None
    return _result(job_id, dict(_FIELD.findall(text.stdout)))
