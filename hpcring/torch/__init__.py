"""`import hpcring.torch as hvd`: the `horovod.torch` API on PyTorch 2.x, over MPI.

Everything a Horovod script uses is here under the same name, with the same defaults and semantics: lifecycle
(init, shutdown, rank, size, ...), the collective ops and their async/in-place/grouped variants with autograd,
handles (poll, synchronize), join, barrier, process sets, the timeline, DistributedOptimizer, the broadcast
helpers, Compression and SyncBatchNorm. Importing this package imports torch; `import hpcring` alone does not.
"""

from __future__ import annotations

from hpcring.collective.engine import ProcessSet, global_process_set
from hpcring.torch.basics import (
    add_process_set,
    barrier,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hpcring.torch.compression import Compression
from hpcring.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hpcring.torch.mpi_ops import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from hpcring.torch.optimizer import DistributedOptimizer
from hpcring.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]


def __getattr__(name: str) -> object:
    """Horovod names hpcring does not provide get an error that says so, not a bare AttributeError."""
    if name == "elastic":
        raise AttributeError(
            "hpcring.torch has no 'elastic' (horovod.torch.elastic: hvd.elastic.run, TorchState, "
            "ElasticSampler): elastic training is not implemented. Run a fixed number of ranks and resume "
            "from a checkpoint instead (examples/train_digits.py writes one on rank 0)."
        )
    raise AttributeError(f"module 'hpcring.torch' has no attribute {name!r}")
