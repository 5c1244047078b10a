"""PBS Pro / OpenPBS: `#PBS` directives (one `-l select` chunk per node, `-l place=scatter`, walltime, queue,
project, `-l filesystems` where the site asks for it), submitted with `qsub script`; ranks start with mpiexec
(Cray PALS or MPICH hydra, `launchers/mpiexec.py`).

PBS starts a job script in the home directory; the template moves to `$PBS_O_WORKDIR` (where qsub ran) first,
as Slurm and LSF do by themselves.
"""

from __future__ import annotations

import re

from hpcring.schedulers import walltime
from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw, check_line_safe

# qsub takes job names of letters, digits and `_ . -` (PBS Pro's reference: up to 236 characters); anything
# else would be refused at submit time, so the `-N` value is made of those. HPCRING_JOB_NAME keeps the name.
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
NAME_MAX = 236


def job_name(name: str) -> str:
    """The `-N` value for a job name: other characters become `_`, and it starts with a letter or digit."""
    safe = _NAME_BAD.sub("_", name).lstrip("_.-")
    return (safe or "job")[:NAME_MAX]


def select(rm: RankMap) -> str:
    """The chunk request: one chunk per node with all its CPUs (and GPUs when ranks use them), unless the site
    asks for whole nodes by its own resource only (`site.pbs.ncpus/ngpus: false`, `select: {system: ...}`)."""
    node, shape, opts = rm.profile.node, rm.shape, rm.profile.site.pbs
    chunk = f"select={shape.nodes}"
    if opts.ncpus is not False:
        ncpus = opts.ncpus if opts.ncpus is not None else node.cores * node.threads_per_core
        chunk += f":ncpus={ncpus}"
    if shape.gpus_per_rank and opts.ngpus:
        # PBS counts physical GPUs; the node lists each tile of a tiled GPU (Intel Max) as an entry.
        devices = {g.device if g.device is not None else g.index for g in node.gpus}
        chunk += f":ngpus={len(devices)}"
    for key, value in opts.select:
        chunk += f":{key}={value}"
    return chunk


class Pbs(Scheduler):
    name = "pbs"
    directive_prefix = "#PBS"
    template = "pbs/job.sh.j2"
    job_id_var = "PBS_JOBID"

    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        opts = rm.profile.site.pbs
        out = [
            Directive("-N", job_name(job.name), " "),
            Directive("-l", select(rm), " "),
            Directive("-l", f"place={opts.place}", " "),
            Directive("-l", f"walltime={walltime.pbs(rm.shape.time_s)}", " "),
        ]
        if opts.filesystems:
            out.append(Directive("-l", "filesystems=" + ":".join(opts.filesystems), " "))
        if rm.shape.partition is not None:
            out.append(Directive("-q", rm.shape.partition.name, " "))
        if account:
            out.append(Directive("-A", account, " "))
        if opts.keep:
            out.append(Directive("-k", opts.keep, " "))
        if job.output:
            out.append(Directive("-o", job.output, " "))
        if job.error:
            out.append(Directive("-e", job.error, " "))
        else:
            out.append(Directive("-j", "oe", " "))  # one output file, as sbatch's default
        for extra in opts.extra_directives:
            flag, _, value = check_line_safe(
                extra, "site.pbs.extra_directives entry", self.directive_prefix
            ).partition(" ")
            out.append(Directive(flag, value or None, " "))
        return out

    def master_addr(self, rm: RankMap) -> Raw:
        # PBS_NODEFILE lists the job's hosts (a line per chunk's MPI process), the first one first; sed reads
        # all of its input, so no SIGPIPE under pipefail.
        return Raw('"$(sed -n 1p "$PBS_NODEFILE")"')

    def submit_argv(self) -> list[str]:
        return ["qsub"]
