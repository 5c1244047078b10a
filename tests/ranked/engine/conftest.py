"""Fixtures for engine tests that run inside every rank, on numpy only (so they also run in the MPICH venv,
which has no torch). Loaded only inside the ranks (tests/ranked_plugin.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hpcring
from hpcring.collective.topology import Topology
from hpcring.config import EngineSettings
from hpcring.engine import Engine


@pytest.fixture(scope="session")
def world() -> Iterator[Topology]:
    topo = hpcring.init()
    yield topo
    hpcring.shutdown()


@pytest.fixture(scope="session")
def engine(world: Topology) -> Iterator[Engine]:
    """One engine with default settings for the whole session."""
    e = Engine(world, EngineSettings())
    yield e
    e.shutdown()
