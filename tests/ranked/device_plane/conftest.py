"""Fixtures for the device data plane tests (collected only under HPCRING_RANKED=1, inside every rank).

The same tests run two ways:

- in CI (no GPU): CPU tensors through the device plane with gloo standing in for NCCL
  (`HPCRING_CPU_DEVICE_PLANE=gloo`, set here unless the launch set it);
- on a GPU machine, `HPCRING_TEST_DEVICE=cuda`: CUDA tensors on cuda:LOCAL_RANK through NCCL
  (`benchmarks/gpu_check.sh` launches them that way).

Expectations are computed from the rank and the world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from device_cases import CUDA, DEVICE

if not CUDA:
    os.environ.setdefault("HPCRING_CPU_DEVICE_PLANE", "gloo")


@pytest.fixture(scope="session")
def hvd() -> Iterator[ModuleType]:
    """`hpcring.torch`, initialised once per rank (tests that re-initialise restore this state)."""
    import hpcring.torch as hvd

    torch.set_num_threads(1)
    if CUDA:
        torch.cuda.set_device(DEVICE)
    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(scope="session")
def comm() -> object:
    from mpi4py import MPI

    return MPI.COMM_WORLD
