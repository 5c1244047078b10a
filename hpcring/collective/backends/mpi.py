"""The MPI transport: mpi4py buffer calls on contiguous numpy arrays (zero-copy, explicit datatypes).

Every buffer is passed with an explicit MPI datatype, never inferred: ml_dtypes' bfloat16 cannot be exported
through the buffer protocol, and a typo in inference would silently reinterpret bytes. Movement (send, gather,
broadcast) uses the same-width unsigned integer view of any dtype; reductions use the real type, and are only
offered (`can_reduce`) for dtypes MPI can add exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcring._deps import mpi
from hpcring.collective.backends.base import OverCommunicator
from hpcring.collective.dtypes import name_of, wire_view
from hpcring.collective.ops import ReduceOp
from hpcring.errors import CollectiveError

NDArray = np.ndarray[Any, Any]

_TYPE_NAMES = {
    "uint8": "UINT8_T",
    "int8": "INT8_T",
    "int16": "INT16_T",
    "int32": "INT32_T",
    "int64": "INT64_T",
    "uint16": "UINT16_T",
    "uint32": "UINT32_T",
    "uint64": "UINT64_T",
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "bool": "C_BOOL",
}
_OP_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX", ReduceOp.PRODUCT: "PROD"}
# MPI defines only logical ops on C_BOOL; on bools MIN is AND and MAX is OR.
_BOOL_OP_NAMES = {ReduceOp.MIN: "LAND", ReduceOp.MAX: "LOR"}


_DATATYPES: dict[np.dtype[Any], Any] = {}
_MPI_OPS: dict[tuple[np.dtype[Any], int], Any] = {}  # (dtype, id(ReduceOp member)) -> MPI op


def _datatype(dtype: np.dtype[Any]) -> Any:
    """MPI datatype of a numpy dtype (cached: this sits on the per-call path of small messages)."""
    found = _DATATYPES.get(dtype)
    if found is None:
        found = _DATATYPES[dtype] = getattr(mpi(), _TYPE_NAMES[name_of(dtype)])
    return found


def _spec(buf: NDArray) -> list[Any]:
    """Typed message spec for a reduction buffer."""
    return [buf, _datatype(buf.dtype)]


def _wire(buf: NDArray) -> list[Any]:
    """Untyped (same-width unsigned) message spec for pure data movement."""
    view = wire_view(buf)
    return [view, _datatype(view.dtype)]


class _Request:
    __slots__ = ("_req",)

    def __init__(self, req: Any) -> None:
        self._req = req

    def wait(self) -> None:
        self._req.Wait()

    def test(self) -> bool:
        """Non-blocking completion check (drives MPI progress once); optional in the Request protocol."""
        return bool(self._req.Test())


def _displs(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


class MPITransport(OverCommunicator):
    """Transport over one mpi4py intracommunicator (owned by the Topology that created it)."""

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        self._mpi = mpi()

    def isend(self, buf: NDArray, dest: int, tag: int) -> _Request:
        return _Request(self.comm.Isend(_wire(buf), dest, tag))

    def irecv(self, buf: NDArray, source: int, tag: int) -> _Request:
        return _Request(self.comm.Irecv(_wire(buf), source, tag))

    def sendrecv(self, sendbuf: NDArray, dest: int, recvbuf: NDArray, source: int, tag: int) -> None:
        self.comm.Sendrecv(_wire(sendbuf), dest, tag, _wire(recvbuf), source, tag)

    def wait_all(self, requests: Sequence[Any]) -> None:
        self._mpi.Request.Waitall([r._req for r in requests])

    def can_reduce(self, dtype: np.dtype[Any], op: ReduceOp) -> bool:
        name = name_of(dtype)
        if name == "bool":
            return op in _BOOL_OP_NAMES
        return name in _TYPE_NAMES and op.base in _OP_NAMES

    def _op(self, dtype: np.dtype[Any], op: ReduceOp) -> Any:
        """The MPI op for `op` on `dtype`, remembered by the op's identity (every small allreduce asks, and
        a dict lookup by an Enum member hashes it in Python)."""
        found = _MPI_OPS.get((dtype, id(op)))
        if found is None:
            if not self.can_reduce(dtype, op):
                raise CollectiveError(f"MPI cannot reduce {name_of(dtype)} with {op.name} natively")
            names = _BOOL_OP_NAMES if name_of(dtype) == "bool" else _OP_NAMES
            found = _MPI_OPS[(dtype, id(op))] = getattr(self._mpi, names[op.base])
        return found

    def reduction(self, dtype: np.dtype[Any], op: ReduceOp) -> tuple[Any, Any]:
        """The MPI datatype and op `allreduce` sends a `dtype` buffer with under `op` (exactly reducible)."""
        return _datatype(dtype), self._op(dtype, op)

    def allreduce(self, buf: NDArray, op: ReduceOp, sendbuf: NDArray | None = None) -> None:
        send = self._mpi.IN_PLACE if sendbuf is None else _spec(sendbuf)
        self.comm.Allreduce(send, _spec(buf), self._op(buf.dtype, op))

    def reduce_scatter(self, sendbuf: NDArray, recvbuf: NDArray, counts: Sequence[int], op: ReduceOp) -> None:
        self.comm.Reduce_scatter(_spec(sendbuf), _spec(recvbuf), list(counts), self._op(sendbuf.dtype, op))

    def allgatherv(self, buf: NDArray, counts: Sequence[int], sendbuf: NDArray | None = None) -> None:
        view = wire_view(buf)
        recv = [view, (list(counts), _displs(counts)), _datatype(view.dtype)]
        send = self._mpi.IN_PLACE if sendbuf is None else _wire(sendbuf)
        self.comm.Allgatherv(send, recv)

    def allgather(self, sendbuf: NDArray, recvbuf: NDArray) -> None:
        self.comm.Allgather(_wire(sendbuf), _wire(recvbuf))

    def bcast(self, buf: NDArray, root: int) -> None:
        self.comm.Bcast(_wire(buf), root)

    def alltoallv(
        self, sendbuf: NDArray, sendcounts: Sequence[int], recvbuf: NDArray, recvcounts: Sequence[int]
    ) -> None:
        s, r = wire_view(sendbuf), wire_view(recvbuf)
        self.comm.Alltoallv(
            [s, (list(sendcounts), _displs(sendcounts)), _datatype(s.dtype)],
            [r, (list(recvcounts), _displs(recvcounts)), _datatype(r.dtype)],
        )


def make_transport(comm: Any) -> MPITransport:
    """Registry entry point."""
    return MPITransport(comm)
