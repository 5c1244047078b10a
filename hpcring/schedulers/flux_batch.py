"""Flux: `# flux:` directives (nodes, tasks, walltime, queue, bank, exclusive nodes, job attributes),
submitted with `flux batch script`; ranks start with `flux run` (`launchers/flux_run.py`).

Flux reads `# flux:` lines with shell-like quoting (Python's shlex), so values go on them double-quoted with
`\\` and `"` escaped, the same form as `#SBATCH` values; line breaks are refused before rendering.
"""

from __future__ import annotations

from hpcring.schedulers import walltime
from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.launchers.flux_run import resources
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw, check_line_safe


class Flux(Scheduler):
    name = "flux"
    directive_prefix = "# flux:"
    template = "flux/job.sh.j2"
    job_id_var = "FLUX_JOB_ID"

    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        opts = rm.profile.site.flux
        out = [Directive("--job-name", job.name)]
        out += [Directive.from_text(f) for f in resources(rm)]
        out.append(Directive("-t", walltime.flux(rm.shape.time_s), " "))
        if rm.shape.partition is not None:
            out.append(Directive("-q", rm.shape.partition.name, " "))
        if account:
            out.append(Directive("--bank", account))
        if opts.exclusive:
            out.append(Directive("--exclusive"))
        for key, value in opts.setattr:
            out.append(Directive("--setattr", f"{key}={value}"))
        if job.output:
            out.append(Directive("--output", job.output))
        if job.error:
            out.append(Directive("--error", job.error))
        for extra in opts.extra_directives:
            out.append(
                Directive.from_text(
                    check_line_safe(extra, "site.flux.extra_directives entry", self.directive_prefix)
                )
            )
        return out

    def master_addr(self, rm: RankMap) -> Raw:
        # The batch script runs inside the job's own Flux instance: its hosts are `instance`, first one first.
        return Raw('"$(flux hostlist -n 0 instance)"')

    def submit_argv(self) -> list[str]:
        return ["flux", "batch"]
