"""What the planner asks of a batch system (Scheduler) and of a rank launcher (Launcher).

Each implementation is a small class named by its `name`; `registry` lists the built-in ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw


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
