"""Rank program run inside Slurm jobs: reports where the rank landed and checks collectives across nodes.

Each rank writes OUTDIR/rank-NNN.json with what Slurm says (SLURM_PROCID/LOCALID/NODEID, SLURMD_NODENAME),
what hpcring says (rank/local_rank/cross_rank/local_size/...), its hostname, pid and CPU affinity. The test
then compares these with `hpcring map`'s prediction for the same job. With --collectives, every allreduce
algorithm runs on sizes that do and do not divide by the local size, and the results are checked against the
closed-form sum over ranks; a wrong result makes the rank exit 1 (and the job fail). With --kill-rank R, rank
R SIGKILLs itself after a first allreduce while the others keep reducing (or computing, outside MPI): the job
must end, not hang.

Runs in both venvs (MPICH's has no torch), so it uses numpy arrays only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpcring import collective as hc

ALGORITHMS = ("native", "ring", "hierarchical")
SIZES = (1, 7, 4096 + 3, 1 << 18)  # uneven sizes exercise the shard arithmetic of ring/hierarchical


def placement() -> dict[str, Any]:
    """What Slurm and the OS say about this process."""
    slurm = {
        k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME")
    }
    return {
        "slurm": slurm,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def check_allreduce(size: int, rank: int) -> list[dict[str, Any]]:
    """Allreduce rank-dependent data with every algorithm; compare with the exact sum over ranks."""
    results = []
    for algorithm in ALGORITHMS:
        for n in SIZES:
            for dtype in (np.float64, np.int32):
                x = (np.arange(n) + rank).astype(dtype)
                want = size * np.arange(n, dtype=np.float64) + size * (size - 1) / 2
                got = hc.allreduce(x, algorithm=algorithm)
                ok = bool(got.shape == x.shape and np.array_equal(np.asarray(got, dtype=np.float64), want))
                results.append({"algorithm": algorithm, "n": n, "dtype": np.dtype(dtype).name, "ok": ok})
    return results


def kill_test(kill_rank: int, rank: int, outdir: Path, survivors: str) -> None:
    """Rank `kill_rank` dies by SIGKILL mid-job; the job must then end every other rank.

    survivors="collective": the others keep reducing, so MPI itself sees the peer vanish (and may abort
    first);
    survivors="compute": the others are busy outside MPI, so only the launcher can stop them.
    """
    hc.allreduce(np.ones(8), algorithm="native")
    (outdir / f"alive-{rank:03d}.pid").write_text(str(os.getpid()))
    if rank == kill_rank:
        time.sleep(1.0)  # let every survivor enter its loop below first
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 120  # a hang guard only: the job must end far sooner
    while time.monotonic() < deadline:
        if survivors == "collective":
            hc.allreduce(np.ones(1024), algorithm="native")
        else:
            time.sleep(0.05)
    (outdir / f"survived-{rank:03d}").write_text("the job was not torn down after a rank died\n")
    sys.exit(3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--collectives", action="store_true", help="check every allreduce algorithm")
    parser.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself mid-job")
    parser.add_argument(
        "--survivors",
        choices=("collective", "compute"),
        default="collective",
        help="what the others do meanwhile",
    )
    args = parser.parse_args()
    report = placement()
    hc.init()
    rank, size = hc.rank(), hc.size()
    report.update(
        rank=rank,
        size=size,
        local_rank=hc.local_rank(),
        local_size=hc.local_size(),
        cross_rank=hc.cross_rank(),
        cross_size=hc.cross_size(),
    )
    if args.kill_rank is not None:
        kill_test(args.kill_rank, rank, args.outdir, args.survivors)
    if args.collectives:
        report["allreduce"] = check_allreduce(size, rank)
    (args.outdir / f"rank-{rank:03d}.json").write_text(json.dumps(report))
    bad = [r for r in report.get("allreduce", []) if not r["ok"]]
    for r in bad:
        print(f"rank {rank}: wrong allreduce result: {r}", file=sys.stderr)
    hc.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
