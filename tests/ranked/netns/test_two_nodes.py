"""Runs inside every rank of a job spread over fake nodes (network namespaces, see ci/netns-cluster.sh).

Launched by tests/integration/netns/test_netns_two_nodes.py as `hpcring run -H n1:L,n2:L,...`. Expectations
come from the rank, the world size and HPCRING_TEST_NODES (the node names, in host-list order). Each node's
eth0 is its only way out, so its byte counters (/sys/class/net/eth0/statistics, which `ip netns exec` remounts
per namespace) tell how much each algorithm really sent between nodes. Theory for N nodes of L ranks, S bytes:

- any allreduce: every node must receive at least S bytes of the other nodes' data (and send as much);
- flat ring (node-contiguous rank order): 2(NL-1)/(NL) * S per node and direction, 1.5 S for 2x2;
- hierarchical: only the cross-node allreduce of each node's shards, 2(N-1)/N * S, i.e. S for 2 nodes.

Runs in both venvs (MPICH's has no torch), so it uses numpy arrays only.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from hpcring import collective as hc

NODES = os.environ.get("HPCRING_TEST_NODES", "").split(",")
ALGORITHMS = ("native", "ring", "hierarchical")
SIZES = (1, 7, 4096 + 3, (1 << 18) + 1)  # sizes that do not divide by 2 or 4 exercise the shard arithmetic
BIG = 8 << 20  # bytes per allreduce for the traffic accounting: well above the control traffic
STATS = Path("/sys/class/net/eth0/statistics")


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    hc.init()


def counters() -> tuple[int, int]:
    """(tx, rx) bytes of this node's link, as the kernel counts them (headers included)."""
    return int((STATS / "tx_bytes").read_text()), int((STATS / "rx_bytes").read_text())


def test_each_node_is_its_own_host() -> None:
    """Ranks see the hostname of the node they run on, nodes in host-list order, L ranks on each."""
    names = hc_allgather_str(socket.gethostname())
    local = hc.local_size()
    assert len(NODES) * local == hc.size(), (NODES, local, hc.size())
    assert names == [n for n in NODES for _ in range(local)]  # -H fills each host's slots in order
    assert socket.gethostname() == NODES[hc.cross_rank()]


def test_topology_matches_the_nodes() -> None:
    """local/cross ranks and sizes as Horovod defines them, for the node layout the launcher was given."""
    local = hc.size() // len(NODES)
    assert hc.local_size() == local
    assert hc.cross_size() == len(NODES)
    assert hc.local_rank() == hc.rank() % local
    assert hc.cross_rank() == hc.rank() // local
    assert STATS.exists(), "not inside a fake node's network namespace"


def hc_allgather_str(text: str) -> list[str]:
    """Every rank's string, in rank order, through hpcring's own allgather of fixed-width bytes."""
    raw = np.frombuffer(text.encode().ljust(64, b"\0")[:64], dtype=np.uint8).copy()
    gathered = np.asarray(hc.allgather(raw)).reshape(hc.size(), 64)
    return [bytes(row).rstrip(b"\0").decode() for row in gathered]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_is_exact_across_nodes(algorithm: str) -> None:
    """Every algorithm gives the exact sum over ranks, for uneven sizes and several dtypes."""
    size, rank = hc.size(), hc.rank()
    for n in SIZES:
        for dtype in ("float32", "float64", "int32"):
            x = (np.arange(n) + rank + 1).astype(dtype)
            want = size * np.arange(n, dtype=np.float64) + size * (size + 1) / 2
            got = np.asarray(hc.allreduce(x, algorithm=algorithm, op=hc.ReduceOp.SUM), dtype=np.float64)
            assert got.shape == (n,)
            np.testing.assert_array_equal(got, want, err_msg=f"{algorithm} n={n} {dtype}")


def bytes_moved(algorithm: str) -> tuple[int, int]:
    """Link bytes (tx, rx) of this node during one BIG allreduce; barriers fence off other traffic."""
    x = np.full(BIG // 4, float(hc.rank() + 1), dtype=np.float32)
    hc.allreduce(x, algorithm=algorithm, op=hc.ReduceOp.SUM)  # warm-up: connections, buffers
    hc.barrier()
    tx0, rx0 = counters()
    hc.barrier()
    out = np.asarray(hc.allreduce(x, algorithm=algorithm, op=hc.ReduceOp.SUM))
    hc.barrier()
    tx1, rx1 = counters()
    hc.barrier()
    assert out[0] == hc.size() * (hc.size() + 1) / 2
    return tx1 - tx0, rx1 - rx0


def test_traffic_crosses_the_link_as_theory_says() -> None:
    """Bytes on this node's eth0 per algorithm: at least S for any, 2(NL-1)/NL*S for ring, ~2(N-1)/N*S for
    hierarchical. Shows the data really went over TCP between namespaces (not shared memory) and that the
    hierarchical algorithm sends less between nodes than the flat ring."""
    n_nodes, nl = len(NODES), hc.size()
    moved = {a: bytes_moved(a) for a in ALGORITHMS}
    report = ", ".join(f"{a}: tx {t / 2**20:.2f} MiB rx {r / 2**20:.2f} MiB" for a, (t, r) in moved.items())
    lower = 2 * (n_nodes - 1) / n_nodes * BIG  # no allreduce can send less per node and direction
    for algorithm, (tx, rx) in moved.items():
        assert tx >= lower and rx >= lower, f"{algorithm} moved less than {lower / 2**20:.2f} MiB: {report}"
    ring_theory = 2 * (nl - 1) / nl * BIG
    assert min(moved["ring"]) >= 0.97 * ring_theory, report
    # Headers and ACKs add ~5%; a little control traffic (launcher, MPI daemons) may share the window.
    assert max(moved["hierarchical"]) <= 1.10 * lower + (1 << 20), report
    if hc.local_rank() == 0:
        print(f"\n[{socket.gethostname()}] per-node link bytes for {BIG >> 20} MiB: {report}")


def test_torch_store_rendezvous_where_rank_0_is_not_the_first_host() -> None:
    """The torch transport (gloo here; NCCL on GPUs: the same rendezvous) connects when rank 0 of its
    communicator is not on the job's first host (MASTER_ADDR): the node-local group of every node, and a
    communicator in reverse rank order, whose rank 0 is on the last node. Each group then sums its ranks."""
    pytest.importorskip("torch.distributed")
    from mpi4py import MPI

    from hpcring.collective.backends.nccl import TorchTransport

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    reverse = world.Split(0, world.size - world.rank)
    try:
        for comm, members in ((node, hc.local_size()), (reverse, world.size)):
            transport = TorchTransport(comm, "gloo")
            try:
                buf = np.full(5, float(world.rank))
                transport.allreduce(buf, hc.ReduceOp.SUM)
                ranks = comm.allgather(world.rank)
                assert len(ranks) == members
                assert buf.tolist() == [float(sum(ranks))] * 5
            finally:
                transport.close()
    finally:
        node.Free()
        reverse.Free()
