"""Fixtures shared by the suites that run inside every rank (collected only under HPCRING_RANKED=1).

`hvd` and `comm` are what a user script has: `hpcring.torch` initialised once, and mpi4py's COMM_WORLD
next to it. torch and mpi4py are imported inside the fixtures, so suites that use neither (the collective
and engine suites also run in the MPICH environment, which has no torch) load this file unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest


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
