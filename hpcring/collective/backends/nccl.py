"""The NCCL transport: a torch.distributed process group per communicator, behind the `Transport` seam.

GPU tensors are reduced inside a node by NCCL while MPI carries the cross-node stage, as the CPU path uses
MPI shared memory + MPI. A `TorchTransport` wraps one `ProcessGroup` built directly (not through
`init_process_group`, so several coexist and a user's own `torch.distributed` setup is untouched); its
rendezvous is a TCPStore whose address rank 0 broadcasts over MPI. Buffers may be numpy arrays (viewed as
CPU tensors) or torch tensors on the group's device; objects and barriers go through MPI. The engine's
device plane (`hpcring/engine/device_plane.py`) uses `reduce_scatter_equal` and `allgather_equal`, which map
to NCCL's own collectives without padding or copies. With backend "gloo" the same class runs on CPU tensors:
that is how CI tests it (docs/dev/collectives.md, "Transports and backends", has the recipe for a GPU
machine).

Call `close()` when done: a process group torn down by the garbage collector at interpreter exit can abort
the process (gloo's worker threads still hold tensors then).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hpcring import _deps
from hpcring.collective.arrays import to_kind
from hpcring.collective.backends.base import OverCommunicator
from hpcring.collective.ops import ReduceOp
from hpcring.errors import BackendUnavailable, ConfigError

NDArray = np.ndarray[Any, Any]
_TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("HPCRING_NCCL_TIMEOUT_S", "600")))


def group_timeout(seconds: float | None) -> datetime.timedelta:
    """A process group's timeout: `seconds` when > 0 (the engine passes HPCRING_COLLECTIVE_TIMEOUT), else
    HPCRING_NCCL_TIMEOUT_S or 600 s (torch's NCCL default: a timeout turned off in hpcring stays bounded)."""
    return datetime.timedelta(seconds=seconds) if seconds else _TIMEOUT


class _Done:
    """A completed request (for transfers that finished synchronously)."""

    def wait(self) -> None:
        return None


class _Work:
    """A torch.distributed Work as a transport Request."""

    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self) -> None:
        self._work.wait()


def _tensor(buf: Any) -> Any:
    """A torch tensor sharing `buf`'s memory (numpy arrays become CPU tensors; bfloat16 keeps its type)."""
    torch = _deps.torch()
    if isinstance(buf, torch.Tensor):
        return buf
    return to_kind(np.ascontiguousarray(buf), torch_like=True)


def _reduce_op(op: ReduceOp) -> Any:
    dist = _deps.require("torch.distributed")
    table = {
        ReduceOp.SUM: dist.ReduceOp.SUM,
        ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.MAX: dist.ReduceOp.MAX,
        ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    }
    if op not in table:
        raise ConfigError(f"the torch transport reduces with SUM, MIN, MAX or PRODUCT, not {op.name}")
    return table[op]


def announced_host(hostnames: Sequence[str]) -> str:
    """Where the ranks of a communicator reach the store its rank 0 opens (`hostnames`: every rank's, in rank
    order): loopback when all of them run on rank 0's host (one-node jobs, the node-local groups of the
    hierarchical route), else rank 0's host name, which the MPI launcher already needed every node to resolve.
    Not MASTER_ADDR: that is the job's first host, while the store listens wherever rank 0 of *this*
    communicator runs (a node-local group on the second node, a process set starting there)."""
    return "127.0.0.1" if len(set(hostnames)) == 1 else hostnames[0]


def _rendezvous(comm: Any) -> Any:
    """A store every rank of `comm` shares: rank 0 listens on a free port, MPI tells the others where."""
    dist = _deps.require("torch.distributed")
    hostnames = comm.allgather(socket.gethostname())
    if comm.Get_rank() == 0:
        host = announced_host(hostnames)
        # wait_for_workers=False: the workers learn the port only from the bcast below.
        store = dist.TCPStore(host, 0, comm.Get_size(), True, timeout=_TIMEOUT, wait_for_workers=False)
        address = comm.bcast((host, store.port, uuid.uuid4().hex), root=0)
    else:
        address = comm.bcast(None, root=0)
        store = dist.TCPStore(address[0], address[1], comm.Get_size(), False, timeout=_TIMEOUT)
    return dist.PrefixStore(f"hpcring/{address[2]}", store)


class TorchTransport(OverCommunicator):
    """A Transport over a torch.distributed process group ("nccl" for CUDA tensors, "gloo" for CPU).

    `timeout_s`: the group's own collective timeout (`group_timeout`); torch's watchdog enforces it on work
    that runs on CUDA streams, where the engine thread does not wait.

    Collective over `comm`: every rank of it constructs its transport at the same point. `device` (NCCL
    only): this rank's CUDA device; given, the NCCL communicator is created now (eagerly, while every rank is
    here) instead of at the first collective.
    """

    def __init__(
        self, comm: Any, backend: str = "nccl", device: Any = None, timeout_s: float | None = None
    ) -> None:
        dist = _deps.require("torch.distributed")
        super().__init__(comm)
        self.backend = backend
        if backend not in ("nccl", "gloo"):
            raise ConfigError(f"unknown torch transport backend {backend!r}; allowed: 'nccl' or 'gloo'")
        if backend == "nccl" and not (dist.is_available() and dist.is_nccl_available()):
            raise BackendUnavailable(
                "NCCL", "a CUDA build of torch (pip install torch==2.13.0 from the CUDA index)"
            )
        store = _rendezvous(comm)
        timeout = group_timeout(timeout_s)
        if backend == "nccl":
            self.pg = _nccl_group(dist, store, self._rank, self._size, device, timeout)
        else:
            self.pg = dist.ProcessGroupGloo(store, self._rank, self._size, timeout)

    def isend(self, buf: NDArray, dest: int, tag: int) -> _Work:
        return _Work(self.pg.send([_tensor(buf)], dest, tag))

    def irecv(self, buf: NDArray, source: int, tag: int) -> _Work:
        return _Work(self.pg.recv([_tensor(buf)], source, tag))

    def sendrecv(self, sendbuf: NDArray, dest: int, recvbuf: NDArray, source: int, tag: int) -> None:
        with self.p2p_group():
            recv = self.irecv(recvbuf, source, tag)
            send = self.isend(sendbuf, dest, tag)
        send.wait()
        recv.wait()

    @contextlib.contextmanager
    def p2p_group(self) -> Iterator[None]:
        """Sends and receives posted inside run as one group (NCCL: ncclGroupStart/End).

        NCCL queues a rank's point-to-point operations on one stream: posted apart, a receive waits for the
        peer's send, which waits behind the peer's own receive, and every rank of a ring (or a rank sending to
        itself) hangs. gloo needs no group."""
        grouped = self.backend == "nccl"
        if grouped:
            self.pg._group_start()
        try:
            yield
        finally:
            if grouped:
                self.pg._group_end()

    def wait_all(self, requests: Sequence[Any]) -> None:
        for r in requests:
            r.wait()

    def can_reduce(self, dtype: np.dtype[Any], op: ReduceOp) -> bool:
        """NCCL and gloo add float16 and bfloat16 themselves; bool has no arithmetic here."""
        return dtype != np.bool_ and op is not ReduceOp.AVERAGE

    def allreduce(self, buf: NDArray, op: ReduceOp, sendbuf: NDArray | None = None) -> None:
        dist = _deps.require("torch.distributed")
        t = _tensor(buf)
        if sendbuf is not None:
            t.copy_(_tensor(sendbuf))
        opts = dist.AllreduceOptions()
        opts.reduceOp = _reduce_op(op)
        self.pg.allreduce([t], opts).wait()

    def reduce_scatter_equal(self, sendbuf: Any, recvbuf: Any, op: ReduceOp) -> None:
        """Reduce-scatter of `size` equal parts: recvbuf (sendbuf.numel() / size elements, not overlapping
        sendbuf) gets the reduction of part `rank` (ncclReduceScatter)."""
        dist = _deps.require("torch.distributed")
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _reduce_op(op)
        self.pg._reduce_scatter_base(_tensor(recvbuf), _tensor(sendbuf), opts).wait()

    def allgather_equal(self, sendbuf: Any, recvbuf: Any) -> None:
        """Allgather of equal parts: recvbuf holds `size` times sendbuf, in rank order (ncclAllGather)."""
        self.pg._allgather_base(_tensor(recvbuf), _tensor(sendbuf)).wait()

    def reduce_scatter(self, sendbuf: NDArray, recvbuf: NDArray, counts: Sequence[int], op: ReduceOp) -> None:
        """Reduce-scatter with per-rank counts: parts padded to the largest count, one equal-part call."""
        src, out = _tensor(sendbuf).reshape(-1), _tensor(recvbuf).reshape(-1)
        mine = counts[self._rank]
        if len(set(counts)) == 1:
            if mine:
                self.reduce_scatter_equal(src, out, op)
            return
        width = max(counts)
        padded = src.new_zeros(width * self._size)
        off = 0
        for i, c in enumerate(counts):
            padded[i * width : i * width + c] = src[off : off + c]
            off += c
        part = src.new_empty(width)
        self.reduce_scatter_equal(padded, part, op)
        out.copy_(part[:mine])

    def allgatherv(self, buf: NDArray, counts: Sequence[int], sendbuf: NDArray | None = None) -> None:
        """Allgather with per-rank counts into `buf`: one equal-part allgather (parts padded to the largest
        count when they differ), then packed in rank order."""
        out = _tensor(buf).reshape(-1)
        offsets = [sum(counts[:i]) for i in range(len(counts))]
        lo, mine_n = offsets[self._rank], counts[self._rank]
        mine = _tensor(sendbuf).reshape(-1) if sendbuf is not None else out[lo : lo + mine_n]
        width = max(counts) if counts else 0
        if width == 0:
            return
        if len(set(counts)) == 1:
            self.allgather_equal(mine.clone() if sendbuf is None else mine, out)
            return
        padded = out.new_zeros(width)
        padded[:mine_n] = mine
        gathered = out.new_empty(width * self._size)
        self.allgather_equal(padded, gathered)
        for i, c in enumerate(counts):
            out[offsets[i] : offsets[i] + c] = gathered[i * width : i * width + c]

    def bcast(self, buf: NDArray, root: int) -> None:
        dist = _deps.require("torch.distributed")
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.pg.broadcast([_tensor(buf)], opts).wait()

    def alltoallv(
        self, sendbuf: NDArray, sendcounts: Sequence[int], recvbuf: NDArray, recvcounts: Sequence[int]
    ) -> None:
        """All-to-all with per-peer element counts, in one process-group call (ncclAllToAllv-style grouped
        sends and receives on NCCL; no per-peer pair communicators, no ordering hazards)."""
        dist = _deps.require("torch.distributed")
        src, dst = _tensor(sendbuf).reshape(-1), _tensor(recvbuf).reshape(-1)
        self.pg.alltoall_base(dst, src, list(recvcounts), list(sendcounts), dist.AllToAllOptions()).wait()

    def close(self) -> None:
        """Shut the process group down now (idempotent), rather than leave it to interpreter exit."""
        pg, self.pg = getattr(self, "pg", None), None
        if pg is None:
            return
        shutdown = getattr(pg, "shutdown", None) or getattr(pg, "abort", None)
        if shutdown is not None:
            shutdown()


def _nccl_group(dist: Any, store: Any, rank: int, size: int, device: Any, timeout: datetime.timedelta) -> Any:
    """ProcessGroupNCCL with our timeout (its own watchdog aborts a collective that outlives it), connected
    eagerly on `device` when one is given (as torch.distributed's own factory builds it)."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    pg = dist.ProcessGroupNCCL(store, rank, size, opts)
    if device is not None and hasattr(pg, "eager_connect_single_device"):
        pg.eager_connect_single_device(device)
    return pg


def make_transport(comm: Any) -> TorchTransport:
    """The registry's entry point (`backends.make_transport("nccl", comm)`)."""
    return TorchTransport(comm, "nccl")
