"""Shared test plumbing.

Multi-rank tests are ordinary pytest files under `tests/ranked/`; each rank runs them, computing expectations
from its rank and the world size. The parent suite never collects them: a test elsewhere launches them
through the real launcher (`hpcring run -np N -- python -m pytest tests/ranked/...`), always under a timeout,
with the `hpcring_run` fixture below. Importable helpers live in `tests/support.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import RANKED, RunRanks, run_ranks


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip tests/ranked unless we are one rank of a launched job (HPCRING_RANKED=1)."""
    if RANKED in collection_path.parents or collection_path == RANKED:
        return os.environ.get("HPCRING_RANKED") != "1"
    return None


@pytest.fixture
def hpcring_run() -> RunRanks:
    """Launch `cmd` on `np` ranks with the real launcher; returns the completed process (never hangs)."""
    return run_ranks
