"""hpcring's collective layer: topology, reduce ops and the data operations, over a pluggable transport.

Importing this package does not import mpi4py or torch; they are loaded by `init()` and by the first tensor
that arrives. See docs/guide/collectives.md for semantics, dtypes, algorithms and the `auto` rule.
"""

from __future__ import annotations

from hpcring.collective.api import allgather, allreduce, alltoall, barrier, broadcast, reducescatter
from hpcring.collective.ops import ReduceOp
from hpcring.collective.runtime import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
    topology,
)
from hpcring.collective.topology import Topology

__all__ = [
    "ReduceOp",
    "Topology",
    "allgather",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "cross_rank",
    "cross_size",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "reducescatter",
    "shutdown",
    "size",
    "topology",
]
