"""Time to a formed world: `hpcring.spark.run` against `hpcring run` of the same size (the peer).

Both run the same work: import hpcring.torch, `hvd.init()`, one allreduce, return. Spark: the time of one
`hpcring.spark.run(fn, num_proc=N)` call on a running local-cluster[2,2,1024] session (stage scheduling, the
barrier, each task's `mpiexec -n 1` worker, the rendezvous, the function, the results); peer: one
`hpcring run -np N -- python -c ...` from start to exit. Medians of `--repeat` rounds, alternating. The
session's own start is printed once.

    .venv/bin/python benchmarks/bench_spark.py --sizes 2 4 --repeat 3
(from this repository's main venv: the executors borrow the MPICH venv as tests/spark does).
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
sys.path.insert(0, str(ROOT / "tests" / "ray"))

PROGRAM = "import torch, hpcring.torch as hvd; hvd.init(); hvd.allreduce(torch.ones(1), op=hvd.Sum)"


def work() -> int:
    import torch

    import hpcring.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return int(hvd.rank())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    from pyspark.sql import SparkSession
    from ray_support import mpich_env

    import hpcring.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    env = {**mpich_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    builder = SparkSession.builder.master("local-cluster[2,2,1024]").config("spark.ui.enabled", "false")
    builder = builder.config("spark.driver.host", "127.0.0.1")
    for name, value in env.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    start = time.perf_counter()
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    while session.sparkContext.defaultParallelism < max(opts.sizes):
        time.sleep(0.5)
    print(f"session start (executors registered): {time.perf_counter() - start:.1f} s", flush=True)
    hpcring.spark.run(work, num_proc=max(opts.sizes))  # warm the executors' Python workers once
    hpcring_bin = str(Path(sys.executable).parent / "hpcring")
    try:
        for size in opts.sizes:
            spark_s, peer_s = [], []
            for _ in range(opts.repeat):
                start = time.perf_counter()
                assert hpcring.spark.run(work, num_proc=size) == list(range(size))
                spark_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                cmd = [hpcring_bin, "run", "-np", str(size), "--", sys.executable, "-c", PROGRAM]
                subprocess.run(cmd, check=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
                peer_s.append(time.perf_counter() - start)
            s, p = statistics.median(spark_s), statistics.median(peer_s)
            print(
                f"N={size}: spark.run {s:.2f} s {[round(x, 2) for x in spark_s]}, "
                f"hpcring run {p:.2f} s {[round(x, 2) for x in peer_s]}, ratio {s / p:.2f}x",
                flush=True,
            )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
