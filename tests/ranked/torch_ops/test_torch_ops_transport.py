"""The torch.distributed transport (hpcring/collective/backends/nccl.py) against the Transport contract.

In CI it runs with gloo on CPU (no GPU here): the rendezvous over MPI, every Transport method, and the
collective library's own ring allreduce driven through it. On a GPU machine, HPCRING_TEST_TRANSPORT=nccl runs
the same tests on CUDA tensors (cuda:local_rank) through ProcessGroupNCCL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from hpcring.collective.algorithms.ring import ring_allreduce
from hpcring.collective.backends.nccl import TorchTransport
from hpcring.collective.ops import ReduceOp

BACKEND = os.environ.get("HPCRING_TEST_TRANSPORT", "gloo")


@pytest.fixture(scope="module")
def transport() -> Iterator[TorchTransport]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    if BACKEND == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    t = TorchTransport(comm, BACKEND)
    yield t
    t.close()  # a process group left to interpreter exit can abort the process
    comm.Free()


def dev(x: np.ndarray) -> Any:
    """The buffer as the transport takes it: numpy on gloo, a CUDA tensor on NCCL."""
    return torch.from_numpy(x).cuda() if BACKEND == "nccl" else x


def host(x: Any) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT])
def test_allreduce_ops(transport: TorchTransport, op: ReduceOp) -> None:
    n, r = transport.size, transport.rank
    buf = dev(np.full(5, r + 1.0, np.float32))
    transport.allreduce(buf, op)
    values = [q + 1.0 for q in range(n)]
    want = {
        ReduceOp.SUM: sum(values),
        ReduceOp.MIN: 1.0,
        ReduceOp.MAX: float(n),
        ReduceOp.PRODUCT: np.prod(values),
    }
    np.testing.assert_allclose(host(buf), np.full(5, want[op], np.float32))


def test_half_precision_is_reduced_natively(transport: TorchTransport) -> None:
    n, r = transport.size, transport.rank
    assert transport.can_reduce(np.dtype(np.float16), ReduceOp.SUM)
    assert not transport.can_reduce(np.dtype(np.bool_), ReduceOp.SUM)
    buf = dev(np.full(3, 0.5 * (r + 1), np.float16))
    transport.allreduce(buf, ReduceOp.SUM)
    np.testing.assert_allclose(host(buf).astype(np.float32), 0.5 * n * (n + 1) / 2)


def test_bcast_and_send_recv_ring(transport: TorchTransport) -> None:
    n, r = transport.size, transport.rank
    buf = dev(np.full(4, float(r)))
    transport.bcast(buf, n - 1)
    assert host(buf).tolist() == [float(n - 1)] * 4
    send, recv = dev(np.full(3, float(r))), dev(np.zeros(3))
    transport.sendrecv(send, (r + 1) % n, recv, (r - 1) % n, tag=5)
    assert host(recv).tolist() == [float((r - 1) % n)] * 3
    with transport.p2p_group():  # NCCL: posted apart, the receives would wait for sends queued behind them
        reqs = [transport.irecv(recv, (r - 1) % n, 6), transport.isend(send, (r + 1) % n, 6)]
    transport.wait_all(reqs)
    assert host(recv).tolist() == [float((r - 1) % n)] * 3


def test_allgatherv_reduce_scatter_alltoallv(transport: TorchTransport) -> None:
    n, r = transport.size, transport.rank
    counts = [q + 1 for q in range(n)]
    out = dev(np.zeros(sum(counts)))
    transport.allgatherv(out, counts, sendbuf=dev(np.full(r + 1, float(r))))
    assert host(out).tolist() == [float(q) for q in range(n) for _ in range(q + 1)]
    total = sum(counts)
    mine = dev(np.zeros(counts[r]))
    transport.reduce_scatter(dev(np.arange(total, dtype=np.float64)), mine, counts, ReduceOp.SUM)
    lo = sum(counts[:r])
    assert host(mine).tolist() == [float(n * v) for v in range(lo, lo + counts[r])]
    sendcounts = [j + 1 for j in range(n)]  # rank r sends j + 1 values of 100r + j to rank j
    send = dev(np.concatenate([np.full(j + 1, 100.0 * r + j) for j in range(n)]))
    recvcounts = [r + 1] * n
    recv = dev(np.zeros(sum(recvcounts)))
    transport.alltoallv(send, sendcounts, recv, recvcounts)
    assert host(recv).tolist() == [100.0 * q + r for q in range(n) for _ in range(r + 1)]
    assert transport.allgather_object(r) == list(range(n))
    transport.barrier()


def test_equal_part_collectives(transport: TorchTransport) -> None:
    """reduce_scatter_equal / allgather_equal: the single-call stages of the device hierarchical allreduce."""
    n, r = transport.size, transport.rank
    src = dev(np.arange(3 * n, dtype=np.float32) + r)
    part = dev(np.zeros(3, np.float32))
    transport.reduce_scatter_equal(src, part, ReduceOp.MAX)
    assert host(part).tolist() == [float(3 * r + k + n - 1) for k in range(3)]
    out = dev(np.zeros(3 * n, np.float32))
    transport.allgather_equal(part, out)
    assert host(out).tolist() == [float(3 * q + k + n - 1) for q in range(n) for k in range(3)]
    equal = dev(np.zeros(2 * n, np.float64))
    transport.allgatherv(equal, [2] * n, sendbuf=dev(np.full(2, float(r))))
    assert host(equal).tolist() == [float(q) for q in range(n) for _ in range(2)]


def test_the_ring_algorithm_runs_over_it(transport: TorchTransport) -> None:
    n, r = transport.size, transport.rank
    src = np.arange(1000, dtype=np.float32) + r
    dst = np.empty_like(src)
    if BACKEND == "nccl":
        pytest.skip("the ring algorithm reduces numpy buffers on the host; NCCL runs the native path")
    ring_allreduce(transport, src, dst, ReduceOp.SUM, 512)
    np.testing.assert_allclose(dst, np.arange(1000, dtype=np.float32) * n + n * (n - 1) / 2)
