"""Computing the Plan of a job placed as a RankMap: the scheduler's directives and environment, the
launcher's command line for each step, the files it reads, and the container around the rank command."""

from __future__ import annotations

from hpcring.errors import ConfigError, choices
from hpcring.schedulers import container_engine, containers, interconnect, network, registry
from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec, describe
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.model import LAUNCHERS_OF
from hpcring.schedulers.plan import Directive, ExtraFile, Plan, RenderOptions, StepPlan
from hpcring.schedulers.shell import Raw, check_line_safe
from hpcring.version import __version__


def job_env(rm: RankMap, job: JobSpec, sched: Scheduler) -> list[tuple[str, str]]:
    """The ranks' environment: the site's network block (or, without one, the interconnect's defaults), then
    hpcring's rendezvous variables, then the site's and the job's own (later wins). Shared by every
    scheduler's plan, the Kubernetes manifest included."""
    profile, shape = rm.profile, rm.shape
    uses_gpus = shape.gpus_per_rank > 0
    gpu_aware = network.gpu_aware(profile.site, profile.name, job.gpu_aware_mpi)
    replaces, stack = network.job_env(profile.site, uses_gpus, gpu_aware)
    env: list[tuple[str, str]] = [] if replaces else interconnect.env_for(profile.node, uses_gpus)
    env += stack
    env += [
        ("MASTER_ADDR", sched.master_addr(rm)),
        ("MASTER_PORT", "29500"),
        ("HPCRING_JOB_NAME", job.name),
        ("HPCRING_PROFILE", profile.name),
    ]
    if uses_gpus and profile.node.gpu_visibility == "shared":
        # Every rank sees all GPUs; this says which are its own, by local rank: "0|1|2|3" or "0,1|2,3".
        env.append(("HPCRING_RANK_GPUS", "|".join(",".join(map(str, s.gpus)) for s in rm.slots(0))))
    env += list(profile.site.env)
    env += list(job.env)
    merged: dict[str, str] = {}
    for k, v in env:
        if not k.isidentifier() or not k.isascii():
            raise ConfigError(f"environment variable name {k!r} is not valid; use letters, digits and '_'")
        merged.pop(k, None)  # later wins, and takes the later position
        merged[k] = v
    return list(merged.items())


def check_values(job: JobSpec, account: str | None, prefix: str = "directive") -> None:
    """Values that land on directive lines (`prefix`: the scheduler's `#SBATCH`, `#PBS`...) stay on one
    line."""
    for what, value in (
        ("job name", job.name),
        ("account", account),
        ("partition", job.partition),
        ("output path", job.output),
        ("error path", job.error),
    ):
        if value is not None:
            check_line_safe(value, what, prefix)


def build(
    rm: RankMap,
    job: JobSpec,
    options: RenderOptions | None = None,
    *,
    launcher_name: str | None = None,
) -> Plan:
    """The Plan for `job` placed as `rm`."""
    opts = options or RenderOptions()
    profile = rm.profile
    site = profile.site
    if not job.steps:
        raise ConfigError(
            "nothing to run: give a command after '--', --step lines, or command/steps in --job"
        )
    account = job.account or site.account
    if site.account_required and not account:
        raise ConfigError(
            f"profile {profile.name!r} requires an account/project: pass --account (or HPCRING_ACCOUNT, or "
            "'account:' in the job file)"
        )
    sched = registry.scheduler(site.scheduler)
    if not sched.template:
        raise ConfigError(
            f"profile {profile.name!r} ({sched.name}) has no job script: its jobs are rendered as manifests"
        )
    check_values(job, account, sched.directive_prefix)
    launch = registry.launcher(launcher_name or site.launcher)
    if launch.name not in LAUNCHERS_OF.get(sched.name, (launch.name,)):
        raise ConfigError(
            f"launcher {launch.name!r} cannot start ranks under {sched.name}; allowed: "
            f"{choices(LAUNCHERS_OF[sched.name])}"
        )
    contents = launch.files(rm)
    files: list[ExtraFile] = []
    paths: dict[str, str] = {}
    for suffix, content in contents.items():
        var = f"HPCRING_{suffix.upper()}"
        path = (
            f"{opts.files_dir.rstrip('/')}/{opts.basename}.{suffix}" if opts.files_dir is not None else None
        )
        if path is not None:
            check_line_safe(path, "file path", sched.directive_prefix)
        paths[suffix] = Raw(f'"${var}"')
        where = _shared_inline_path if suffix in launch.node_files else _inline_path
        files.append(ExtraFile(var, suffix, content, path, path or where(sched.job_id_var, suffix)))
    ctr = containers.plan(profile, job.image, job.binds, rm.shape.gpus_per_rank > 0)
    if ctr is not None and ctr.launcher_args and launch.name != "srun":
        raise ConfigError(f"runtime {ctr.runtime!r} starts ranks through srun, not {launch.name!r}")
    if ctr is not None and ctr.edf is not None:
        files.append(_edf_file(ctr.edf, opts, sched.job_id_var))
    steps = []
    for i, step in enumerate(job.steps, 1):
        command = (*ctr.prefix, *step.argv) if ctr else step.argv
        banner = f"hpcring: step {i}/{len(job.steps)}: {describe(step)}"
        argv = launch.argv(rm, command, paths)
        if ctr is not None and ctr.launcher_args:
            argv = [argv[0], *ctr.launcher_args, *argv[1:]]  # `srun --environment=... <flags> command`
        steps.append(StepPlan(banner, tuple(argv)))
    s = rm.shape
    uses_gpus = s.gpus_per_rank > 0
    net_dirs = network.directives(site, uses_gpus)
    summary = (
        f"{s.nodes} node(s) x {s.max_ranks_per_node} rank(s) = {s.ranks} ranks, {s.gpus_per_rank} GPU(s) and "
        f"{s.cpus_per_rank} core(s) x {s.threads_per_core} thread(s) per rank, launcher {launch.name}"
    )
    return Plan(
        scheduler=sched.name,
        template=sched.template,
        version=__version__,
        profile=profile.name,
        digest=profile.digest,
        summary=summary,
        directive_prefix=sched.directive_prefix,
        directives=(
            *sched.directives(rm, job, account),
            *(_extra_directive(d, sched.directive_prefix, "site.network.directives entry") for d in net_dirs),
            *(_extra_directive(d, sched.directive_prefix) for d in (ctr.directives if ctr else ())),
        ),
        modules=(
            *site.modules,
            *network.modules(site, uses_gpus),
            *(ctr.modules if ctr else ()),
            *job.modules,
        ),
        module_paths=ctr.module_paths if ctr else (),
        env=tuple(job_env(rm, job, sched)),
        workdir=job.workdir,
        files=tuple(files),
        container=ctr,
        steps=tuple(steps),
        submit_argv=tuple(sched.submit_argv()),
        warnings=(profile.retired_warning,) if profile.retired_warning else (),
    )


def _extra_directive(text: str, prefix: str, what: str = "site.container.directives entry") -> Directive:
    """A profile's extra directive ("-l a=b" or "--flag=value"), checked to stay on its line."""
    return Directive.from_text(check_line_safe(text, what, prefix))


def _edf_file(content: str, opts: RenderOptions, job_var: str) -> ExtraFile:
    """The Container Engine's EDF: next to the script with `-o`, else inline in the job's working directory
    (srun reads it from there on the first node; the job's directory is on the shared file system)."""
    suffix = container_engine.EDF_SUFFIX
    path = f"{opts.files_dir.rstrip('/')}/{opts.basename}.{suffix}" if opts.files_dir is not None else None
    if path is not None:
        check_line_safe(path, "file path")
    return ExtraFile(
        container_engine.EDF_VAR, suffix, content, path, path or _shared_inline_path(job_var, suffix)
    )


def _shared_inline_path(job_var: str, suffix: str) -> Raw:
    """Run-time path of an inline file every node reads: per job, in the job's working directory."""
    return Raw(f'"$PWD/.hpcring-${{{job_var}:-$$}}.{suffix}"')


def _inline_path(job_var: str, suffix: str) -> Raw:
    """Run-time path of an inline file: per job (the scheduler's job id variable), under $TMPDIR."""
    return Raw(f'"${{TMPDIR:-/tmp}}/hpcring-${{{job_var}:-$$}}.{suffix}"')
