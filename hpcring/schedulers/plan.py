"""The Plan: every directive, module, variable, file and command line of a job script, as data.

Templates only format a Plan (`jobscript`), and `planner` alone computes one, so tests can check a Plan's
numbers directly and a template cannot get one wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcring.contracts.wallclock import REQUEUE_EXIT_CODE, WARNING_FILE
from hpcring.schedulers.containers import ContainerPlan


@dataclass(frozen=True)
class Directive:
    """One `#SBATCH`/`#BSUB` line: flag, separator ("=" or " ") and value (None for a bare flag)."""

    flag: str
    value: str | None = None
    sep: str = "="

    @classmethod
    def from_text(cls, text: str) -> Directive:
        """ "--flag=value" or "--flag" (sep "="), "-f value" or "-f" (sep " ")."""
        if text.startswith("--"):
            flag, sep, value = text.partition("=")
            return cls(flag, value if sep else None)
        flag, _, value = text.partition(" ")
        return cls(flag, value or None, " ")


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
class RequeuePlan:
    """What the script's requeue block formats (slurm/requeue.sh.j2; hpcring.schedulers.requeue)."""

    notes: tuple[str, ...]  # comment lines: what the scheduler does, and where its documentation says so
    checkpoint_dir: str | None  # a literal path; None: `default_name` in the working directory
    default_name: str
    max_requeues: int | None
    timer_s: int | None  # the script warns itself after this many seconds (PBS: no pre-limit signal)
    requeue: str  # the shell line that requeues the job (no user strings in it)
    exit_code: int = REQUEUE_EXIT_CODE
    warning_file: str = WARNING_FILE


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
    warnings: tuple[str, ...] = ()  # written as `# WARNING:` lines under the header (a retired system)
    requeue: RequeuePlan | None = None  # train past the wall clock (hpcring.schedulers.requeue)

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
