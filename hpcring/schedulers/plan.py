"""The Plan: every directive, module, variable, file and command line of a job script, computed in Python.

Templates only format a Plan, so tests can check a Plan's numbers directly and a template cannot get one
wrong.
Schedulers (`slurm`, `lsf`, `pbs`, `flux`) and launchers (`srun`, `jsrun`, `mpirun`, `mpiexec`, `flux`) are
small classes registered by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from hpcring import __version__
from hpcring.errors import ConfigError, choices
from hpcring.schedulers import containers, interconnect
from hpcring.schedulers.containers import ContainerPlan
from hpcring.schedulers.job import JobSpec, describe
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.model import LAUNCHERS_OF
from hpcring.schedulers.shell import Raw, check_line_safe


@dataclass(frozen=True)
class Directive:
    """One `#SBATCH`/`#BSUB` line: flag, separator ("=" or " ") and value (None for a bare flag)."""

    flag: str
    value: str | None = None
    sep: str = "="


@dataclass(frozen=True)
class ExtraFile:
    """A file the launcher reads (ERF, rankfile): written next to the script, or inline by a here-document."""

    var: str  # shell variable holding its path at run time
    suffix: str
    content: str
    path: str | None  # absolute path when written next to the script; None: inline
    location: str  # what the script assigns to `var`: the path, or a per-job temporary file (Raw)


@dataclass(frozen=True)
class StepPlan:
    """One launcher invocation; the script runs them one after another, stopping at the first failure."""

    banner: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """What a template formats."""

    scheduler: str
    template: str
    version: str
    profile: str
    digest: str
    summary: str
    directive_prefix: str
    directives: tuple[Directive, ...]
    modules: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    files: tuple[ExtraFile, ...]
    container: ContainerPlan | None
    steps: tuple[StepPlan, ...]
    submit_argv: tuple[str, ...]
    module_paths: tuple[str, ...] = ()  # `module use` before the loads (a container runtime's module tree)

    @property
    def inline_files(self) -> tuple[ExtraFile, ...]:
        return tuple(f for f in self.files if f.path is None)

    @property
    def env_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for k, _ in self.env))


@dataclass(frozen=True)
class RenderOptions:
    """Where extra files go: `files_dir` (absolute) writes them next to the script; None writes them
    inline."""

    files_dir: str | None = None
    basename: str = "job"


class Launcher(ABC):
    """Turns a RankMap into the argv that starts every rank of one step, plus the files it reads."""

    name: ClassVar[str]
    # Suffixes of files every node reads (a per-rank wrapper), not only the launcher on the first node:
    # written inline, they go to the job's working directory (shared) instead of the first node's $TMPDIR.
    node_files: ClassVar[frozenset[str]] = frozenset()

    def files(self, rm: RankMap) -> dict[str, str]:
        """suffix -> content of files this launcher needs (default: none)."""
        return {}

    @abstractmethod
    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        """Command line starting `command` on every rank; `paths` maps a file suffix to its run-time path."""

    @abstractmethod
    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        """The mapping in this launcher's own notation (`hpcring map --format`)."""


class Scheduler(ABC):
    """Turns a job and its RankMap into directives, an environment and a submit command."""

    name: ClassVar[str]
    directive_prefix: ClassVar[str]
    template: ClassVar[str]
    job_id_var: ClassVar[str]  # variable holding the job id at run time (used in inline file names)

    @abstractmethod
    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        """Batch directives for the job."""

    @abstractmethod
    def master_addr(self, rm: RankMap) -> Raw:
        """Shell expression giving the first compute node's host name at run time."""

    @abstractmethod
    def submit_argv(self) -> list[str]:
        """Submit command; the script path is appended."""


LAUNCHERS: dict[str, type[Launcher]] = {}
SCHEDULERS: dict[str, type[Scheduler]] = {}
_L = TypeVar("_L", bound=type[Launcher])
_S = TypeVar("_S", bound=type[Scheduler])


def register_launcher(cls: _L) -> _L:
    LAUNCHERS[cls.name] = cls
    return cls


def register_scheduler(cls: _S) -> _S:
    SCHEDULERS[cls.name] = cls
    return cls


def _load_registries() -> None:
    """Import the built-in launcher and scheduler modules (they register themselves)."""
    from hpcring.schedulers import flux, lsf, pbs, slurm  # noqa: F401
    from hpcring.schedulers.launchers import flux_run, jsrun, mpiexec, mpirun, srun  # noqa: F401


def launcher(name: str) -> Launcher:
    _load_registries()
    if name not in LAUNCHERS:
        raise ConfigError(f"unknown launcher {name!r}; allowed: {choices(sorted(LAUNCHERS))}")
    return LAUNCHERS[name]()


def scheduler(name: str) -> Scheduler:
    _load_registries()
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler {name!r}; allowed: {choices(sorted(SCHEDULERS))}")
    return SCHEDULERS[name]()


def _env(rm: RankMap, job: JobSpec, sched: Scheduler) -> list[tuple[str, str]]:
    """Interconnect defaults, then hpcring's rendezvous variables, then the site's and the job's own."""
    profile, shape = rm.profile, rm.shape
    uses_gpus = shape.gpus_per_rank > 0
    env: list[tuple[str, str]] = interconnect.env_for(profile.node, uses_gpus)
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


def _check_values(job: JobSpec, account: str | None) -> None:
    """Values that land on directive lines must stay on one line."""
    for what, value in (
        ("job name", job.name),
        ("account", account),
        ("partition", job.partition),
        ("output path", job.output),
        ("error path", job.error),
    ):
        if value is not None:
            check_line_safe(value, what)


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
    _check_values(job, account)
    sched = scheduler(site.scheduler)
    launch = launcher(launcher_name or site.launcher)
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
            check_line_safe(path, "file path")
        paths[suffix] = Raw(f'"${var}"')
        where = shared_inline_path if suffix in launch.node_files else inline_path
        files.append(ExtraFile(var, suffix, content, path, path or where(sched.job_id_var, suffix)))
    ctr = containers.plan(profile, job.image, job.binds, rm.shape.gpus_per_rank > 0)
    steps = []
    for i, step in enumerate(job.steps, 1):
        command = (*ctr.prefix, *step.argv) if ctr else step.argv
        banner = f"hpcring: step {i}/{len(job.steps)}: {describe(step)}"
        steps.append(StepPlan(banner, tuple(launch.argv(rm, command, paths))))
    s = rm.shape
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
            *(extra_directive(d) for d in (ctr.directives if ctr else ())),
        ),
        modules=(*site.modules, *(ctr.modules if ctr else ()), *job.modules),
        module_paths=ctr.module_paths if ctr else (),
        env=tuple(_env(rm, job, sched)),
        workdir=job.workdir,
        files=tuple(files),
        container=ctr,
        steps=tuple(steps),
        submit_argv=tuple(sched.submit_argv()),
    )


def extra_directive(text: str) -> Directive:
    """A container-only directive ("-l a=b" or "--flag=value"), checked to stay on its line."""
    check_line_safe(text, "site.container.directives entry")
    if text.startswith("--"):
        flag, sep, value = text.partition("=")
        return Directive(flag, value if sep else None)
    flag, _, value = text.partition(" ")
    return Directive(flag, value or None, " ")


def shared_inline_path(job_var: str, suffix: str) -> Raw:
    """Run-time path of an inline file every node reads: per job, in the job's working directory."""
    return Raw(f'"$PWD/.hpcring-${{{job_var}:-$$}}.{suffix}"')


def inline_path(job_var: str, suffix: str) -> Raw:
    """Run-time path of an inline file: per job (the scheduler's job id variable), under $TMPDIR."""
    return Raw(f'"${{TMPDIR:-/tmp}}/hpcring-${{{job_var}:-$$}}.{suffix}"')
