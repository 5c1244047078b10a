"""The Adasum suite inside each rank: on a GPU machine (HPCRING_TEST_DEVICE=cuda, benchmarks/gpu_check.sh)
each rank's CUDA device is made current before the shared `hvd` fixture initialises hpcring.torch."""

from __future__ import annotations

import torch
from adasum_cases import CUDA, DEVICE

if CUDA:
    torch.cuda.set_device(DEVICE)
