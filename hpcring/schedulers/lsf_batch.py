"""LSF: `#BSUB` directives (`-nnodes` with jsrun/CSM as on Summit, `-n` + `span[ptile=]` with mpirun), one
`-alloc_flags` line, submitted as `bsub script` (LSF reads the `#BSUB` lines of a script given as
argument)."""

from __future__ import annotations

import re

from hpcring.schedulers import walltime
from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw, check_line_safe

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def output_name(job_name: str) -> str:
    """The default `-o` file, `<name>.%J.out`, from a job name made safe as one file name in the working
    directory: `/` (a directory bsub would need to exist) and other characters become `_`, and a leading `-`
    or `.` goes (an option-like or hidden file). The `-J` name itself stays as the user gave it."""
    stem = _UNSAFE.sub("_", job_name).lstrip("-.") or "hpcring"
    return f"{stem}.%J.out"


class Lsf(Scheduler):
    name = "lsf"
    directive_prefix = "#BSUB"
    template = "lsf/job.sh.j2"
    job_id_var = "LSB_JOBID"

    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        shape, site = rm.shape, rm.profile.site
        out = [Directive("-J", job.name, " ")]
        if site.launcher == "jsrun":
            out.append(Directive("-nnodes", str(shape.nodes), " "))
        else:
            out.append(Directive("-n", str(shape.ranks), " "))
            out.append(Directive("-R", f"span[ptile={shape.max_ranks_per_node}]", " "))
            if shape.gpus_per_rank:
                gpus = shape.gpus_per_rank * shape.max_ranks_per_node
                out.append(Directive("-gpu", f"num={gpus}:mode=exclusive_process", " "))
        out.append(Directive("-W", walltime.lsf(shape.time_s), " "))
        if shape.partition is not None:
            out.append(Directive("-q", shape.partition.name, " "))
        if account:
            out.append(Directive("-P", account, " "))
        if site.lsf.alloc_flags:
            out.append(Directive("-alloc_flags", " ".join(site.lsf.alloc_flags), " "))
        out.append(Directive("-o", job.output or output_name(job.name), " "))
        if job.error:
            out.append(Directive("-e", job.error, " "))
        for extra in site.lsf.extra_directives:
            flag, _, value = check_line_safe(
                extra, "site.lsf.extra_directives entry", self.directive_prefix
            ).partition(" ")
            out.append(Directive(flag, value or None, " "))
        return out

    def master_addr(self, rm: RankMap) -> Raw:
        if rm.profile.site.lsf.launch_node:
            # The host file's first line is the launch (batch) node; the first compute host follows it.
            return Raw('"$(awk \'NR > 1 { print; exit }\' "$LSB_DJOB_HOSTFILE")"')
        return Raw('"$(head -n 1 "$LSB_DJOB_HOSTFILE")"')

    def submit_argv(self) -> list[str]:
        return ["bsub"]
