"""Session fixture for the collective tests that run inside every rank: hpcring initialised once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hpcring
from hpcring.collective import Topology


@pytest.fixture(scope="session", autouse=True)
def world() -> Iterator[Topology]:
    """hpcring initialised once per rank for the whole session."""
    topo = hpcring.init()
    yield topo
    hpcring.barrier()
    hpcring.shutdown()
