"""Submitting a rendered script and waiting for its job: the submit command's job id, then polling the
scheduler's state query every `poll` seconds (`<scheduler>_jobs` modules, by scheduler name)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hpcring.errors import SubmitError
from hpcring.schedulers import flux_jobs, lsf_jobs, pbs_jobs, slurm_jobs
from hpcring.schedulers.jobstate import Active, JobResult, OnChange, poll_until_end, run

__all__ = ["JobResult", "OnChange", "submit", "wait"]

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
    query = STATES[scheduler]
    return poll_until_end(lambda: query(job_id), f"job {job_id}", poll, timeout, on_change)
