"""Fixtures shared by the suites that run inside every rank (loaded only inside the ranks).

`hvd` and `comm` are what a user script has: `hpcring.torch` initialised once, and mpi4py's COMM_WORLD
next to it. torch and mpi4py are imported inside the fixtures, so suites that use neither (the collective
and engine suites also run in the MPICH environment, which has no torch) load this file unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Each rank's temporary files go under the launching test's own tmp_path (HPCRING_TEST_BASETEMP, set
    by the `hpcring_run` fixture), one folder per rank: nothing is left in the system temp folder."""
    base = os.environ.get("HPCRING_TEST_BASETEMP")
    if base and config.option.basetemp is None:
        Path(base).mkdir(parents=True, exist_ok=True)  # pytest creates the rank's folder, not its parents
        config.option.basetemp = str(Path(base) / f"rank{os.environ.get('HPCRING_RANK', '0')}")


@pytest.fixture(scope="session")
def hvd() -> Iterator[ModuleType]:
    """`hpcring.torch`, initialised once per rank the way a user script does (tests that re-initialise
    restore this state); shut down at the end of the session."""
    import torch

    import hpcring.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(scope="session")
def comm() -> object:
    """The user's own COMM_WORLD (mpi4py), next to hvd."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def shared_tmp(tmp_path: Path, comm: object) -> Path:
    """Rank 0's tmp_path, the same folder on every rank (files a collective writes on one rank, read on
    another; the ranks of a test share a file system)."""
    return Path(comm.bcast(str(tmp_path) if comm.Get_rank() == 0 else None))  # type: ignore[attr-defined]
