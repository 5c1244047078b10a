"""The NCCL transport: a torch.distributed process group per communicator, behind the `Transport` seam.

GPU tensors are reduced inside a node by NCCL (the hierarchical algorithm's intra-node stages) while MPI
carries the cross-node stage, exactly as the CPU path uses MPI shared memory + MPI. A `TorchTransport` wraps
one torch.distributed `ProcessGroup` built directly (not through `init_process_group`, so several groups, one
per communicator, coexist and a user's own `torch.distributed` setup is untouched). The rendezvous uses MPI:
rank 0 of the communicator opens a TCPStore on a free port and broadcasts its address.

The same class with backend "gloo" runs on CPU tensors and numpy arrays; that is how the transport logic is
tested in CI (tests/ranked/torch_ops/test_torch_ops_transport.py), since no GPU is available there. To verify
on a GPU machine (each rank uses cuda:LOCAL_RANK): `HPCRING_TEST_TRANSPORT=nccl HPCRING_RANKED=1 hpcring run
-np 2 -- python -m pytest tests/ranked/torch_ops/test_torch_ops_transport.py`.

Buffers may be numpy arrays (viewed as CPU tensors without a copy) or torch tensors (on the group's device).
Objects and barriers go through MPI, which every rank has anyway.
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcring import _deps
from hpcring.collective.ops import ReduceOp
from hpcring.errors import BackendUnavailable, ConfigError

NDArray = np.ndarray[Any, Any]
_TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("HPCRING_NCCL_TIMEOUT_S", "600")))


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
    arr = np.ascontiguousarray(buf)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


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


def _rendezvous(comm: Any) -> Any:
    """A store every rank of `comm` shares: rank 0 listens on a free port, MPI tells the others where."""
    dist = _deps.require("torch.distributed")
    if comm.Get_rank() == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        # wait_for_workers=False: the workers learn the port only from the bcast below.
        store = dist.TCPStore(host, 0, comm.Get_size(), True, timeout=_TIMEOUT, wait_for_workers=False)
        address = comm.bcast((host, store.port, uuid.uuid4().hex), root=0)
    else:
        address = comm.bcast(None, root=0)
        store = dist.TCPStore(address[0], address[1], comm.Get_size(), False, timeout=_TIMEOUT)
    return dist.PrefixStore(f"hpcring/{address[2]}", store)


class TorchTransport:
    """A Transport over a torch.distributed process group ("nccl" for CUDA tensors, "gloo" for CPU)."""

    def __init__(self, comm: Any, backend: str = "nccl") -> None:
        dist = _deps.require("torch.distributed")
        self.comm = comm
        self.backend = backend
        self._rank: int = comm.Get_rank()
        self._size: int = comm.Get_size()
        store = _rendezvous(comm)
        if backend == "nccl":
            if not (dist.is_available() and dist.is_nccl_available()):
                raise BackendUnavailable(
                    "NCCL", "a CUDA build of torch (pip install torch==2.13.0 from the CUDA index)"
                )
            self.pg = dist.ProcessGroupNCCL(store, self._rank, self._size)
        elif backend == "gloo":
            self.pg = dist.ProcessGroupGloo(store, self._rank, self._size, _TIMEOUT)
        else:
            raise ConfigError(f"unknown torch transport backend {backend!r}; allowed: 'nccl' or 'gloo'")

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def isend(self, buf: NDArray, dest: int, tag: int) -> _Work:
        return _Work(self.pg.send([_tensor(buf)], dest, tag))

    def irecv(self, buf: NDArray, source: int, tag: int) -> _Work:
        return _Work(self.pg.recv([_tensor(buf)], source, tag))

    def sendrecv(self, sendbuf: NDArray, dest: int, recvbuf: NDArray, source: int, tag: int) -> None:
        recv = self.irecv(recvbuf, source, tag)
        send = self.isend(sendbuf, dest, tag)
        send.wait()
        recv.wait()

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

    def reduce_scatter(self, sendbuf: NDArray, recvbuf: NDArray, counts: Sequence[int], op: ReduceOp) -> None:
        """Allreduce of a copy, then this rank's slice (process groups want equal reduce_scatter parts)."""
        tmp = _tensor(sendbuf).clone()
        self.allreduce(tmp, op)
        lo = sum(counts[: self._rank])
        _tensor(recvbuf).copy_(tmp[lo : lo + counts[self._rank]])

    def allgatherv(self, buf: NDArray, counts: Sequence[int], sendbuf: NDArray | None = None) -> None:
        """Allgather of parts padded to the largest count, then packed into `buf` in rank order."""
        out = _tensor(buf)
        offsets = [sum(counts[:i]) for i in range(len(counts))]
        mine = (
            _tensor(sendbuf)
            if sendbuf is not None
            else out[offsets[self._rank] : offsets[self._rank] + counts[self._rank]]
        )
        width = max(counts) if counts else 0
        padded = out.new_zeros(width)
        padded[: counts[self._rank]] = mine.reshape(-1)
        parts = [out.new_empty(width) for _ in counts]
        self.pg.allgather([parts], [padded]).wait()
        for i, part in enumerate(parts):
            out[offsets[i] : offsets[i] + counts[i]] = part[: counts[i]]

    def bcast(self, buf: NDArray, root: int) -> None:
        dist = _deps.require("torch.distributed")
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.pg.broadcast([_tensor(buf)], opts).wait()

    def alltoallv(
        self, sendbuf: NDArray, sendcounts: Sequence[int], recvbuf: NDArray, recvcounts: Sequence[int]
    ) -> None:
        """Point-to-point exchange with every peer (works on every process-group backend)."""
        src, dst = _tensor(sendbuf), _tensor(recvbuf)
        so = [sum(sendcounts[:i]) for i in range(self._size)]
        ro = [sum(recvcounts[:i]) for i in range(self._size)]
        dst[ro[self._rank] : ro[self._rank] + recvcounts[self._rank]] = src[
            so[self._rank] : so[self._rank] + sendcounts[self._rank]
        ]
        works = []
        for peer in range(self._size):
            if peer == self._rank:
                continue
            if recvcounts[peer]:
                works.append(self.pg.recv([dst[ro[peer] : ro[peer] + recvcounts[peer]]], peer, 0x4154))
            if sendcounts[peer]:
                works.append(
                    self.pg.send([src[so[peer] : so[peer] + sendcounts[peer]].contiguous()], peer, 0x4154)
                )
        for w in works:
            w.wait()

    def allgather_object(self, obj: object) -> list[Any]:
        gathered: list[Any] = self.comm.allgather(obj)
        return gathered

    def barrier(self) -> None:
        self.comm.Barrier()


def make_transport(comm: Any) -> TorchTransport:
    """The registry's entry point (`backends.make_transport("nccl", comm)`)."""
    return TorchTransport(comm, "nccl")
