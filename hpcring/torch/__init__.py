"""`import hpcring.torch as hvd`: the `horovod.torch` API on PyTorch 2.x, over MPI.

Everything a Horovod script uses is here under the same name, with the same defaults and semantics: lifecycle
(init, shutdown, rank, size, ...), the collective ops and their async/in-place/grouped variants with autograd,
handles (poll, synchronize), join, barrier, process sets, the timeline, DistributedOptimizer, the broadcast
helpers, Compression and SyncBatchNorm. Importing this package imports torch; `import hpcring` alone does not.
"""

from __future__ import annotations

from hpcring.torch import mpi_ops
from hpcring.torch.compression import Compression
from hpcring.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hpcring.torch.mpi_ops import *  # noqa: F403 - the op surface, listed once (mpi_ops.__all__)
from hpcring.torch.optimizer import DistributedOptimizer
from hpcring.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    *mpi_ops.__all__,
    "Compression",
    "DistributedOptimizer",
    "SyncBatchNorm",
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def __getattr__(name: str) -> object:
    """`hvd.elastic` is imported on first use (Horovod scripts reach it as an attribute)."""
    if name == "elastic":
        import importlib

        return importlib.import_module("hpcring.torch.elastic")
    raise AttributeError(f"module 'hpcring.torch' has no attribute {name!r}")
