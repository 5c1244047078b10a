"""The rank program of the emulated MPIJob (test_mpijob_pods.py): every rank reports the pod it runs in, then
all train the image's digits example (hpcring.torch's DistributedOptimizer) with the arguments given.

Which pods hold ranks is what the launcher's hostfile decides; the test checks the lines printed here against
the workers it started: ranks on the workers only (never the launcher), slotsPerWorker of them on each.
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

import hpcring


def hosts() -> list[str]:
    """Every rank's host name, in rank order (a fixed-width allgather of the names' bytes)."""
    name = np.zeros(64, dtype=np.uint8)
    raw = socket.gethostname().encode()
    name[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return [bytes(row).rstrip(b"\0").decode() for row in hpcring.allgather(name[None, :])]


def main() -> int:
    sys.path.insert(0, "/opt/hpcring/examples")  # the image's own copy of the example
    import train_digits

    hpcring.init()
    r, n = hpcring.rank(), hpcring.size()
    everyone = hosts()
    # OMP_NUM_THREADS comes from the image's ENV, which reaches ranks on a worker only through sshd's SetEnv.
    omp = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"rank {r}/{n} on {everyone[r]} local {hpcring.local_rank()}/{hpcring.local_size()} omp {omp}",
        flush=True,
    )
    if r == 0:
        print(f"hosts by rank: {','.join(everyone)}", flush=True)
    code: int = train_digits.main(sys.argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
