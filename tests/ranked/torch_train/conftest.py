"""Fixtures for the data-parallel tests that run inside every rank (collected only under HPCRING_RANKED=1).

Expectations are computed locally from the rank, the world size and fixed seeds, so a test needs no extra
collective to know what the right answer is.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="session")
def hvd() -> ModuleType:
    """`hpcring.torch`, initialised once per rank (the way a user script imports it)."""
    import hpcring.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    return hvd
