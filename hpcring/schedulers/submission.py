"""Submitting a rendered script and waiting for its job: the submit command's job id, then polling the
scheduler's state query every `poll` seconds (`<scheduler>_jobs` modules, by scheduler name)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hpcring.errors import SubmitError
from hpcring.schedulers import flux_jobs, lsf_jobs, pbs_jobs, slurm_jobs
from hpcring.schedulers.jobstate import Active, JobResult, run

__all__ = ["JobResult", "submit", "wait"]

# Called at each change of a waited-for job's phase: (job id, the new phase's text, seconds in the previous).
OnChange = Callable[[str, str, float], None]

ID_PARSERS: dict[str, Callable[[str], str | None]] = {
    "slurm": slurm_jobs.job_id,
    "lsf": lsf_jobs.job_id,
    "pbs": pbs_jobs.job_id,
    "flux": flux_jobs.job_id,
}
STATES: dict[str, Callable[[str], JobResult | Active | None]] = {
    "slurm": slurm_jobs.state,
    "lsf": lsf_jobs.state,
    "pbs": pbs_jobs.state,
    "flux": flux_jobs.state,
}


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


def wait(
    scheduler: str,
    job_id: str,
    poll: float = 0.5,
    timeout: float | None = None,
    on_change: OnChange | None = None,
) -> JobResult:
    """Poll until the job ends; its exit code is the job's (128+signal when killed). `on_change` hears each
    change of phase (pending, running, suspended, then the final state) with the time spent in the last."""
    state = STATES[scheduler]
    start = since = time.monotonic()
    shown = ""
    while True:
        result = state(job_id)
        now = time.monotonic()
        text = result.state if isinstance(result, JobResult) else _phase_text(result) if result else shown
        if on_change is not None and text != shown:
            on_change(job_id, text, now - since)
            shown, since = text, now
        if isinstance(result, JobResult):
            return result
        if timeout is not None and now - start > timeout:
            raise SubmitError(f"job {job_id} still running after {timeout:.0f} s (it was left running)")
        time.sleep(poll)


def _phase_text(state: Active) -> str:
    """`running`, or `pending (PD)` where the scheduler's own word differs from the phase's name."""
    return state.phase if state.word.lower() == state.phase else f"{state.phase} ({state.word})"
