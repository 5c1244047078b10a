"""Time to a formed MPI world: N independent one-process MPICH jobs meeting through hpcring.launch.rendezvous
(what hpcring.ray does) against one `mpiexec -n N` of the same program (the peer, in the same run).

Both run the same Python program: import mpi4py and hpcring, obtain an N-process communicator (rendezvous:
form_world through a TCP store; peer: COMM_WORLD), do one allreduce, exit. The time is from the first process
spawned to the last one exited, the median of `--repeat` rounds, peer and rendezvous alternating.

    .venv/bin/python benchmarks/bench_rendezvous.py --sizes 2 4 8 --repeat 5
(from this repository's main venv: the MPICH venv's library and mpiexec are borrowed as in tests/ray).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcring.launch.rendezvous_store import StoreServer  # noqa: E402

PROGRAM = """
import sys
from mpi4py import MPI
from hpcring.launch import rendezvous
from hpcring.launch.rendezvous_store import StoreClient
if len(sys.argv) > 1:
    addr, token, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    comm = rendezvous.form_world(StoreClient(addr, token), rank, size, key="bench")
else:
    comm = MPI.COMM_WORLD
assert comm.allreduce(1) == comm.Get_size()
"""


def _env() -> dict[str, str]:
    mpich = Path(
        os.environ.get("HPCRING_TEST_MPICH_PYTHON") or ROOT / ".venv-mpich" / "bin" / "python"
    ).parent.parent
    return {
        **os.environ,
        "MPI4PY_MPIABI": "mpich",
        "LD_LIBRARY_PATH": str(mpich / "lib"),
        "MPIEXEC": str(mpich / "bin" / "mpiexec"),
        "PYTHONPATH": str(ROOT),
    }


def peer(size: int, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        ["timeout", "120", env["MPIEXEC"], "-n", str(size), sys.executable, "-c", PROGRAM],
        env=env,
        check=True,
    )
    return time.perf_counter() - start


def rendezvous(size: int, env: dict[str, str]) -> float:
    server = StoreServer("127.0.0.1")
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                "timeout",
                "120",
                env["MPIEXEC"],
                "-n",
                "1",
                sys.executable,
                "-c",
                PROGRAM,
                f"127.0.0.1:{server.port}",
                server.token,
                str(r),
                str(size),
            ],
            env=env,
        )
        for r in range(size)
    ]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    server.close()
    if any(codes):
        raise SystemExit(f"rendezvous at {size} failed: exit codes {codes}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    env = _env()
    print("size  mpiexec -n N (s)  rendezvous (s)  ratio")
    for size in args.sizes:
        base, mine = [], []
        for _ in range(args.repeat):
            base.append(peer(size, env))
            mine.append(rendezvous(size, env))
        b, m = statistics.median(base), statistics.median(mine)
        print(f"{size:>4}  {b:16.2f}  {m:14.2f}  {m / b:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
