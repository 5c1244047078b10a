"""A rendered job that trains past its wall clock (the job option `requeue`, flag `--requeue-on-limit`).

Each scheduler offers something different; each entry below is what its own documentation describes:

- Slurm: `#SBATCH --signal=B:USR1@GRACE` sends SIGUSR1 to the batch shell GRACE seconds before the time limit
  (up to 60 s earlier), `--requeue` makes the job requeueable, `--open-mode=append` keeps the earlier runs'
  output, and `scontrol requeue $SLURM_JOB_ID` puts it back in the queue with the same job id
  (https://slurm.schedmd.com/sbatch.html#OPT_signal, #OPT_requeue, #OPT_open-mode;
  https://slurm.schedmd.com/scontrol.html#OPT_requeue).
- LSF: `#BSUB -wa USR1` and `-wt MINUTES` send the warning action that long before the run limit, and
  `brequeue $LSB_JOBID` requeues the job (same id); `-o` appends (IBM Spectrum LSF bsub -wa, -wt, -o;
  brequeue: https://www.ibm.com/docs/en/spectrum-lsf/10.1.0?topic=reference-bsub, ...=reference-brequeue).
- PBS Pro: no signal before the walltime (PBS sends SIGTERM at the limit, then SIGKILL after kill_delay),
  so the script runs its own timer and warns itself GRACE seconds before the walltime; `#PBS -r y` makes the
  job rerunnable, which PBS uses when it preempts or loses a node; `qrerun` needs operator privilege, so the
  job resubmits its own script (`qsub`) (PBS Professional Reference Guide: qsub -r, qrerun, kill_delay).
- Flux: `# flux: --signal=USR1@GRACEs` sends the signal GRACE before the time limit; Flux has no requeue, so
  the job resubmits its own script (`flux batch`) (flux-batch(1), --signal: https://flux-framework.readthedocs.io
  /projects/flux-core/en/latest/man1/flux-batch.html).

The script's trap does not signal the ranks: it writes the warning's kind into the checkpoint directory,
where rank 0 looks at every commit (hpcring.contracts.wallclock.WARNING_FILE); the ranks checkpoint there and
exit with REQUEUE_EXIT_CODE, and the script then requeues the job. The checkpoint directory's default is
`hpcring-checkpoint-<job name>` in the job's working directory, the same for every run of the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from hpcring.errors import ConfigError
from hpcring.schedulers.plan import Directive, RequeuePlan

DEFAULT_GRACE_S = 120  # submitit warns 90 s ahead; a durable checkpoint of a large model takes longer
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RequeueSpec:
    """The job file's `requeue:` (or `--requeue-on-limit[=GRACE]`, `--checkpoint-dir`)."""

    grace_s: int = DEFAULT_GRACE_S
    checkpoint_dir: str | None = None
    max_requeues: int | None = None  # time-limit requeues; None: the ranks' default (3)


def from_mapping(data: Any) -> RequeueSpec:
    """The job file's `requeue:` value (validated by the job schema first): true, or a mapping."""
    if data is True:
        return RequeueSpec()
    return RequeueSpec(
        int(data.get("grace", DEFAULT_GRACE_S)), data.get("checkpoint_dir"), data.get("max_requeues")
    )


def _minutes(seconds: int) -> int:
    return max(1, -(-seconds // 60))


def _scheduler_parts(
    scheduler: str, spec: RequeueSpec, time_s: int, script: str | None
) -> tuple[list[Directive], tuple[str, ...], int | None, str]:
    grace = spec.grace_s
    resubmit_missing = "printf 'hpcring requeue: resubmit this job script to continue\\n' >&2"
    if scheduler == "slurm":
        directives = [Directive("--signal", f"B:USR1@{grace}"), Directive("--requeue")]
        directives.append(Directive("--open-mode", "append"))
        notes = (
            f"Slurm sends SIGUSR1 to this script {grace} s (up to 60 s more) before the time limit:",
            "https://slurm.schedmd.com/sbatch.html#OPT_signal (and #OPT_requeue, #OPT_open-mode);",
            "scontrol requeue keeps the job id: https://slurm.schedmd.com/scontrol.html#OPT_requeue",
        )
        return directives, notes, None, 'scontrol requeue "$SLURM_JOB_ID"'
    if scheduler == "lsf":
        minutes = _minutes(grace)
        directives = [Directive("-wa", "USR1", " "), Directive("-wt", str(minutes), " ")]
        notes = (
            f"LSF sends SIGUSR1 {minutes} min before the run limit (bsub -wa, -wt) and brequeue",
            "requeues the job: https://www.ibm.com/docs/en/spectrum-lsf/10.1.0?topic=reference-bsub,",
            "https://www.ibm.com/docs/en/spectrum-lsf/10.1.0?topic=reference-brequeue",
        )
        return directives, notes, None, 'brequeue "$LSB_JOBID"'
    if scheduler == "pbs":
        if time_s <= grace:
            raise ConfigError(f"requeue: grace {grace} s is not shorter than the job's walltime {time_s} s")
        notes = (
            "PBS sends no signal before the walltime (SIGTERM at it, SIGKILL after kill_delay): this script",
            f"warns itself {grace} s before it; -r y makes the job rerunnable (PBS Professional Reference",
            "Guide, qsub -r); qrerun needs an operator, so the script resubmits itself with qsub",
        )
        line = f"qsub {_quote(script)}" if script else resubmit_missing
        return [Directive("-r", "y", " ")], notes, time_s - grace, line
    if scheduler == "flux":
        notes = (
            f"Flux sends SIGUSR1 {grace} s before the time limit (flux-batch(1) --signal:",
            "https://flux-framework.readthedocs.io/projects/flux-core/en/latest/man1/flux-batch.html);",
            "Flux has no requeue: the script resubmits itself with flux batch",
        )
        line = f"flux batch {_quote(script)}" if script else resubmit_missing
        return [Directive("--signal", f"USR1@{grace}s")], notes, None, line
    raise ConfigError(f"requeue: not supported under {scheduler}: it has no job script to requeue")


def _quote(text: str) -> str:
    from hpcring.schedulers.shell import quote

    return quote(text)


def apply(plan: Any, job: Any, time_s: int, script: str | None) -> Any:
    """The plan with the scheduler's directives and the script's requeue block (unchanged without one).

    `script`: the path the job script is written to (PBS and Flux resubmit it), None when printed."""
    spec: RequeueSpec | None = job.requeue
    if spec is None:
        return plan
    directives, notes, timer, line = _scheduler_parts(plan.scheduler, spec, time_s, script)
    name = _UNSAFE.sub("-", job.name).strip("-") or "job"
    block = RequeuePlan(
        notes=notes,
        checkpoint_dir=spec.checkpoint_dir,
        default_name=f"hpcring-checkpoint-{name}",
        max_requeues=spec.max_requeues,
        timer_s=timer,
        requeue=line,
    )
    return replace(plan, directives=(*plan.directives, *directives), requeue=block)
