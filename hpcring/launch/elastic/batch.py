"""A rendered batch job that keeps training when a node dies (the job file's `elastic: {min_nodes: N}`).

Slurm with srun: `#SBATCH --no-kill` keeps the job alive when a node of its allocation fails, and each step
runs through `hpcring.launch.elastic.slurm`, which relaunches it on the nodes left (docs/guide/elastic.md).
Other schedulers and launchers are refused with the reason: LSF ends a job whose execution host fails (bsub
has no --no-kill; `bsub -r` reruns the whole job from the queue instead) and jsrun cannot shrink a job's
resource sets; mpirun/mpiexec inside Slurm would need a host list rewritten per attempt (use srun).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from typing import Any

from hpcring.errors import ConfigError

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")

_REFUSED = {
    "lsf": "LSF ends a job whose execution host fails (bsub has no --no-kill; `bsub -r` requeues the whole "
    "job instead), so the job cannot go on without the node",
    "pbs": "PBS ends a job whose node fails (no equivalent of Slurm's --no-kill for a running job)",
    "flux": "not implemented for Flux yet",
}


def _python(argv: tuple[str, ...]) -> str:
    """The interpreter the step already runs (it can import hpcring), else the one rendering the job."""
    for word in argv:
        if _PYTHON.match(os.path.basename(word)):
            return word
    return sys.executable


def apply(plan: Any, job: Any) -> Any:
    """The plan with --no-kill and each step run by the elastic step runner (unchanged if not elastic)."""
    from hpcring.schedulers.plan import Directive, StepPlan

    if job.elastic is None:
        return plan
    min_nodes, max_restarts = job.elastic
    if plan.scheduler in _REFUSED:
        raise ConfigError(f"elastic: not supported under {plan.scheduler}: {_REFUSED[plan.scheduler]}")
    if any(step.argv[:1] != ("srun",) for step in plan.steps):
        raise ConfigError(
            "elastic: needs the srun launcher (--launcher srun): the step is relaunched on the "
            "nodes left with srun --nodelist"
        )
    if min_nodes > job.nodes:
        raise ConfigError(f"elastic: min_nodes {min_nodes} is more than the job's {job.nodes} node(s)")
    steps = tuple(
        StepPlan(
            step.banner,
            (
                _python(step.argv),
                "-m",
                "hpcring.launch.elastic.slurm",
                "--min-nodes",
                str(min_nodes),
                "--max-restarts",
                str(max_restarts),
                "--",
                *step.argv,
            ),
        )
        for step in plan.steps
    )
    return replace(plan, directives=(*plan.directives, Directive("--no-kill")), steps=steps)
