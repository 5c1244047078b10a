"""Shared test plumbing.

Multi-rank tests are ordinary pytest files under `tests/ranked/`; each rank runs them, computing expectations
from its rank and the world size. The ranked plugin (tests/ranked_plugin.py, docs/dev/testing.md) reports each
of them, under each launch declared in tests/ranked/launches.py, as an item of this suite, and runs the
launches through the real launcher under a timeout. Other multi-rank programs are launched with the
`hpcring_run` fixture below. Importable helpers live in `tests/support.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support import RunRanks, run_ranks

pytest_plugins = ("ranked_plugin", "pytester")


@pytest.fixture
def hpcring_run(tmp_path: Path) -> RunRanks:
    """Launch `cmd` on `np` ranks with the real launcher; returns the completed process (never hangs).

    The ranks' own pytest runs keep their temporary folders under this test's tmp_path (HPCRING_TEST_BASETEMP,
    read by tests/ranked/conftest.py), so nothing is left in the system temp folder."""

    def run(np: int, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        env = {"HPCRING_TEST_BASETEMP": str(tmp_path / "ranks"), **(kwargs.pop("env", None) or {})}
        return run_ranks(np, cmd, env=env, **kwargs)

    return run


_TEMP_PREFIXES = ("hpcring",)


def _own_temp_entries() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(_TEMP_PREFIXES)}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TEMP_BEFORE] = _own_temp_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test run leaves nothing of hpcring's in the system temp folder: fail the run if it did (CI runs
    alone on its machine; locally, another run at the same time can trip this)."""
    if os.environ.get("HPCRING_RANKED") == "1" or _TEMP_BEFORE not in session.config.stash:
        return
    left = sorted(_own_temp_entries() - session.config.stash[_TEMP_BEFORE])
    if left:
        where = tempfile.gettempdir()
        print(f"\nerror: the test run left these in {where}: {', '.join(left)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TEMP_BEFORE = pytest.StashKey[set[str]]()
