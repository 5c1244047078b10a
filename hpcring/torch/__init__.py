"""`import hpcring.torch as hvd`: the `horovod.torch` API on PyTorch 2.x, over MPI.

Everything a Horovod script uses is here under the same name, with the same defaults and semantics: lifecycle
(init, shutdown, rank, size, ...), the collective ops and their async/in-place/grouped variants with autograd,
handles (poll, synchronize), join, barrier, process sets, the timeline, DistributedOptimizer, the broadcast
helpers, Compression and SyncBatchNorm; also PartialDistributedOptimizer (Horovod's Keras one, for torch),
`process_set_included`, `get_process_set_ids_and_ranks` and `HostsUpdatedInterrupt`; `on_wall_clock` (a job's
time limit or preemption is near: docs/guide/elastic.md). Importing this package
imports torch; `import hpcring` alone does not.
"""

from __future__ import annotations

from hpcring.contracts.wallclock import REQUEUE_EXIT_CODE, STOPPED_EXIT_CODE
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
from hpcring.torch.partial_optimizer import PartialDistributedOptimizer
from hpcring.torch.process_set_info import get_process_set_ids_and_ranks, process_set_included
from hpcring.torch.sync_batch_norm import SyncBatchNorm
from hpcring.torch.wallclock import on_wall_clock

__all__ = [
    *mpi_ops.__all__,
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "REQUEUE_EXIT_CODE",
    "STOPPED_EXIT_CODE",
    "SyncBatchNorm",
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "get_process_set_ids_and_ranks",
    "on_wall_clock",
    "process_set_included",
]


def __getattr__(name: str) -> object:
    """`hvd.elastic` (and its HostsUpdatedInterrupt, which Horovod scripts catch as
    `hvd.HostsUpdatedInterrupt`) are imported on first use."""
    if name == "elastic":
        import importlib

        return importlib.import_module("hpcring.torch.elastic")
    if name == "HostsUpdatedInterrupt":
        from hpcring.torch.elastic.common import HostsUpdatedInterrupt

        return HostsUpdatedInterrupt
    raise AttributeError(f"module 'hpcring.torch' has no attribute {name!r}")
