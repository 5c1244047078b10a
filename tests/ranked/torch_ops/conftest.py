"""Fixtures for the `hpcring.torch` op tests run inside every rank (collected only under HPCRING_RANKED=1).

Every rank runs the same tests in the same order; expectations are computed from the rank and the world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="session")
def hvd() -> Iterator[ModuleType]:
    """`hpcring.torch`, initialised once per rank, the way a user script imports it."""
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
