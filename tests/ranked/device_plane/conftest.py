"""Settings for the device data plane tests (loaded inside every rank only).

The same tests run two ways:

- in CI (no GPU): CPU tensors through the device plane with gloo standing in for NCCL
  (`HPCRING_CPU_DEVICE_PLANE=gloo`, set here unless the launch set it);
- on a GPU machine, `HPCRING_TEST_DEVICE=cuda`: CUDA tensors on cuda:LOCAL_RANK through NCCL
  (`benchmarks/gpu_check.sh` launches them that way).

Expectations are computed from the rank and the world size.
"""

from __future__ import annotations

import os

import torch
from device_cases import CUDA, DEVICE

# The shared `hvd` fixture (tests/ranked/conftest.py) initialises hpcring.torch: these settings come first.
if CUDA:
    torch.cuda.set_device(DEVICE)
else:
    os.environ.setdefault("HPCRING_CPU_DEVICE_PLANE", "gloo")
