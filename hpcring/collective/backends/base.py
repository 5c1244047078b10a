"""The Transport seam: what an algorithm may ask of a group of ranks.

Algorithms (ring, hierarchical) are written once against this protocol and never import mpi4py or torch, so
the same hierarchical code runs over MPI shared memory + MPI on CPU and over NCCL + MPI on GPU. A transport
offers point-to-point transfers on contiguous buffers plus the group's own (native) collectives. Buffers are
numpy arrays here; a GPU transport may accept its own device buffers with the same shapes of call.

Optional attribute: `prefer_native = True` on a transport makes the hierarchical algorithm use that
transport's own reduce_scatter/allgatherv for its intra-node stages instead of our point-to-point ring (right
for NCCL; over MPI the ring is faster and steadier, see docs/dev/collectives.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from hpcring.collective.ops import ReduceOp

NDArray = np.ndarray[Any, Any]


class Request(Protocol):
    """A pending non-blocking transfer.

    Optional method: `test() -> bool`, true once the transfer has completed, never blocking. The hierarchical
    pipeline uses it to post the next cross-node step as soon as the previous one lands, while it waits inside
    the node (`ring.done`); a request without it is simply waited for at the scheduled point.
    """

    def wait(self) -> None: ...


class Transport(Protocol):
    """One group of ranks. `rank`/`size` are within the group; peers are addressed by group rank."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def isend(self, buf: NDArray, dest: int, tag: int) -> Request:
        """Start sending the contiguous `buf` to `dest` (leave it unchanged until the request completes)."""
        ...

    def irecv(self, buf: NDArray, source: int, tag: int) -> Request:
        """Start receiving exactly `buf.size` elements of `buf.dtype` from `source` into `buf`."""
        ...

    def sendrecv(self, sendbuf: NDArray, dest: int, recvbuf: NDArray, source: int, tag: int) -> None:
        """Send and receive at once (deadlock-free exchange with a neighbour)."""
        ...

    def wait_all(self, requests: Sequence[Request]) -> None:
        """Complete every request."""
        ...

    def can_reduce(self, dtype: np.dtype[Any], op: ReduceOp) -> bool:
        """True when the native collectives can reduce `dtype` with `op` exactly (no hidden up/down-cast)."""
        ...

    def allreduce(self, buf: NDArray, op: ReduceOp, sendbuf: NDArray | None = None) -> None:
        """Native allreduce into `buf` (in place when `sendbuf` is None). `op` is never AVERAGE."""
        ...

    def reduce_scatter(self, sendbuf: NDArray, recvbuf: NDArray, counts: Sequence[int], op: ReduceOp) -> None:
        """Native reduce-scatter: rank i gets the reduction of elements [sum(counts[:i]), +counts[i])."""
        ...

    def allgatherv(self, buf: NDArray, counts: Sequence[int], sendbuf: NDArray | None = None) -> None:
        """Native allgather with per-rank counts into `buf`; in place when `sendbuf` is None (own part already
        at its offset in `buf`)."""
        ...

    def allgather(self, sendbuf: NDArray, recvbuf: NDArray) -> None:
        """Native allgather of equal-sized contributions: recvbuf holds size * sendbuf.size elements."""
        ...

    def bcast(self, buf: NDArray, root: int) -> None:
        """Native broadcast of `buf` from group rank `root`."""
        ...

    def alltoallv(
        self, sendbuf: NDArray, sendcounts: Sequence[int], recvbuf: NDArray, recvcounts: Sequence[int]
    ) -> None:
        """Native all-to-all with per-peer element counts (packed in rank order on both sides)."""
        ...

    def allgather_object(self, obj: object) -> list[Any]:
        """Gather a small picklable object from every rank (signatures, sizes)."""
        ...

    def barrier(self) -> None:
        """Wait until every rank of the group has arrived."""
        ...


class OverCommunicator:
    """What every transport here shares: its group is an mpi4py communicator's ranks, and small objects
    and barriers go through that communicator (every rank has MPI anyway)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self._rank = int(comm.Get_rank())
        self._size = int(comm.Get_size())

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def allgather_object(self, obj: object) -> list[Any]:
        gathered: list[Any] = self.comm.allgather(obj)
        return gathered

    def barrier(self) -> None:
        self.comm.Barrier()
