"""What a ranked launch is: one run of ranked test files under `hpcring run` (`Launch`), declared as data in
`tests/ranked/launches.py`; the environment names the two sides of the ranked plugin share
(docs/dev/testing.md).

The launches get the environment the outer pytest started with (`START_ENV`, copied when this module is
imported by the plugin, before any test module), not whatever the outer tests set later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pytest

if TYPE_CHECKING:
    from ranked_records import LaunchResult

START_ENV = dict(os.environ)

REPORTS_ENV = "HPCRING_RANKED_REPORTS"
SELECT_ENV = "HPCRING_RANKED_SELECT"
COLLECT_ENV = "HPCRING_RANKED_COLLECT"
RANKED_DIR = "tests/ranked"
TAIL_LINES = 12  # of a rank's output, in a crash report


def inner() -> bool:
    """Are we one rank of a launched job (or its collect-only run)?"""
    return os.environ.get("HPCRING_RANKED") == "1"


# --- the declaration -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Launch:
    """One run of ranked test files under `hpcring run`.

    `paths` are files or folders under tests/ranked. `env` values may name the launch's own folder as
    `{tmp}`. `requires` lists modules the outer environment must import, else the launch is skipped (as
    `pytest.importorskip` did). `site` is `path/to/module.py:Factory`, a `Site` that places the ranks
    (the network-namespace cluster). `no_skips`: a test skipped in this launch fails (the launch exists to
    run the tests that other launches skip).
    """

    paths: tuple[str, ...]
    np: int
    flavour: str = "openmpi"
    emulate_nodes: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pytest_args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    timeout: int = 240
    requires: tuple[str, ...] = ()
    markers: tuple[str, ...] = ("mpi",)
    site: str | None = None
    no_skips: bool = False
    name: str = ""

    @property
    def id(self) -> str:
        """The item suffix: `openmpi-np4`, `mpich-np4-2nodes`, or the explicit name."""
        if self.name:
            return self.name
        nodes_part = f"-{self.emulate_nodes}nodes" if self.emulate_nodes else ""
        return f"{self.flavour}-np{self.np}{nodes_part}"

    @property
    def key(self) -> str:
        """Unique in the table: `<first folder>/<id>`, e.g. `torch_ops/openmpi-np4-2nodes`."""
        return f"{self.paths[0].split('/')[0]}/{self.id}"


class Site(Protocol):
    """Where a launch's ranks run when not all on this machine's one network stack (see Launch.site)."""

    def skip_reason(self, launch: Launch) -> str | None: ...

    def prepare(self, launch: Launch) -> tuple[list[str], list[str], dict[str, str]]:
        """Bring the site up if needed; (command prefix, launcher arguments, environment) for the launch."""
        ...

    def finished(self, launch: Launch, result: LaunchResult) -> None:
        """After the launch: may record measurements in result.extras."""
        ...

    def close(self) -> None: ...


def uses_launches(*keys: str) -> pytest.MarkDecorator:
    """Parametrize an outer test over launches: its `ranked_launch` argument is each launch's result.

    The launch runs once per session, shared with its ranked items; a launch an outer test asks for runs
    all of its tests, whatever else is selected."""
    return pytest.mark.parametrize(
        "ranked_launch", keys, indirect=True, ids=[k.split("/", 1)[1] for k in keys]
    )
