"""Runs on every rank of a 2-container job (test_image_two_nodes.py): each container is a node with its own
network namespace and hostname, so the launcher must see two nodes and data must cross the link between them.
Checks topology and allreduce results (native, ring, hierarchical) against values from rank and size.
"""

from __future__ import annotations

import os
import socket

import numpy as np

import hpcring

BIG = 8 << 20  # bytes per allreduce: enough to see on the node's link counters


def main() -> None:
    hpcring.init()
    r, n = hpcring.rank(), hpcring.size()
    host = socket.gethostname()
    name = np.zeros(64, dtype=np.uint8)
    name[: len(host)] = np.frombuffer(host.encode(), dtype=np.uint8)
    hosts = {bytes(row).rstrip(b"\0").decode() for row in hpcring.allgather(name[None, :])}
    assert len(hosts) == 2, f"expected 2 nodes, ranks report {sorted(hosts)}"
    assert hpcring.cross_size() == 2 and hpcring.local_size() == n // 2, (hpcring.cross_size(), n)
    for algorithm in ("native", "ring", "hierarchical"):
        x = hpcring.allreduce(np.full(BIG // 8, r + 1.0), algorithm=algorithm)
        assert (x == n * (n + 1) / 2).all(), (algorithm, x[:4])
    print(
        f"rank {r}/{n} on {host} (node {hpcring.cross_rank()}/{hpcring.cross_size()}, uid {os.getuid()}): "
        "allreduce native/ring/hierarchical ok",
        flush=True,
    )
    hpcring.shutdown()


if __name__ == "__main__":
    main()
