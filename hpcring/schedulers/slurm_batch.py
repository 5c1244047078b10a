"""Slurm: `#SBATCH` directives from the shape, `sbatch --parsable` to submit, first node from `scontrol`."""

from __future__ import annotations

from hpcring.schedulers import walltime
from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.launchers.srun import task_flags, uses_wrapper
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw, check_line_safe


def _flag(text: str) -> Directive:
    """ "--nodes=2" -> Directive("--nodes", "2")."""
    flag, sep, value = text.partition("=")
    return Directive(flag, value if sep else None)


class Slurm(Scheduler):
    name = "slurm"
    directive_prefix = "#SBATCH"
    template = "slurm/job.sh.j2"
    job_id_var = "SLURM_JOB_ID"

    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        shape, site, node = rm.shape, rm.profile.site, rm.profile.node
        out = [Directive("--job-name", job.name)]
        out += [_flag(f) for f in task_flags(rm)]
        if shape.gpus_per_rank:
            if node.gpu_visibility == "shared" or uses_wrapper(rm):
                out.append(Directive("--gpus-per-node", str(shape.gpus_per_rank * shape.max_ranks_per_node)))
            else:
                out.append(Directive("--gpus-per-task", str(shape.gpus_per_rank)))
        out.append(Directive("--time", walltime.slurm(shape.time_s)))
        part = shape.partition
        if part is not None:
            out.append(Directive("--qos" if part.selector == "qos" else "--partition", part.name))
        if account:
            out.append(Directive("--account", account))
        if site.slurm.constraint:
            out.append(Directive("--constraint", site.slurm.constraint))
        if site.slurm.core_spec is not None:
            out.append(Directive("--core-spec", str(site.slurm.core_spec)))
        if site.slurm.exclusive:
            out.append(Directive("--exclusive"))
        if job.output:
            out.append(Directive("--output", job.output))
        if job.error:
            out.append(Directive("--error", job.error))
        for extra in site.slurm.extra_directives:
            out.append(
                _flag(check_line_safe(extra, "site.slurm.extra_directives entry", self.directive_prefix))
            )
        return out

    def master_addr(self, rm: RankMap) -> Raw:
        # sed reads all of its input: `head -n 1` could kill scontrol with SIGPIPE, failing under pipefail.
        return Raw('"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"')

    def submit_argv(self) -> list[str]:
        return ["sbatch", "--parsable"]
