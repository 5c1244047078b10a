"""Time per epoch: `TorchEstimator.fit` against a plain DistributedOptimizer loop on the same data held in
memory, run by `hpcring.spark.run` at the same num_proc (the peer).

Both train the same MLP (32 -> 64 -> 1, SGD, MSE) on the same rows with the same batch, shuffle off, rank r
on rows r, r+N, ...: the estimator reads its Parquet shard from the store and draws each batch from it; the
peer gets the rows as numpy arrays in its arguments. Each rank times its epochs; rank 0's epoch times are
kept, medians over the epochs of `--repeat` launches, alternating estimator and peer. Also printed: the
median wall time of a whole fit (data preparation + launch + training) against the peer's whole run.

    .venv/bin/python benchmarks/bench_spark_estimator.py --sizes 2 4 --repeat 3
(from this repository's main venv: the executors borrow the MPICH venv as tests/spark does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "ray"))

FEATURES, HIDDEN, LR = 32, 64, 0.01


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))


def plain_loop(x: Any, y: Any, batch: int, epochs: int, model: Any) -> list[float]:
    """The peer: rank r trains on rows r::size with DistributedOptimizer; returns its epoch times."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    xs = torch.tensor(x[rank::size], dtype=torch.float32)
    ys = torch.tensor(y[rank::size], dtype=torch.float32).reshape(-1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR * size)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = torch.nn.MSELoss()
    steps = len(y) // (batch * size)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        total = 0.0
        for step in range(steps):
            rows = slice(step * batch, (step + 1) * batch)
            opt.zero_grad()
            loss = loss_fn(model(xs[rows]), ys[rows])
            loss.backward()
            opt.step()
            total += float(loss.detach())
        hvd.allreduce(torch.tensor([total / steps]), op=hvd.Average)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5)
    opts = parser.parse_args()
    import numpy as np
    import torch
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession
    from ray_support import mpich_env

    import hpcring.spark
    from hpcring.spark.common.store import Store
    from hpcring.spark.torch import TorchEstimator
    from hpcring.spark.torch.fit import fit

    os.environ["PYSPARK_PYTHON"] = sys.executable
    env = {**mpich_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    builder = SparkSession.builder.master("local-cluster[2,2,1024]").config("spark.ui.enabled", "false")
    builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
    for name, value in env.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    while session.sparkContext.defaultParallelism < max(opts.sizes):
        time.sleep(0.5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(opts.rows, FEATURES))
    y = x @ rng.normal(size=FEATURES) + 0.1 * rng.normal(size=opts.rows)
    df = session.createDataFrame(
        [(Vectors.dense(a), float(b)) for a, b in zip(x, y, strict=True)], ["f", "y"]
    )
    store = Store.create(tempfile.mkdtemp(prefix="bench-spark-est-"))
    try:
        for size in opts.sizes:
            est_epoch, peer_epoch, est_wall, peer_wall = [], [], [], []
            for i in range(opts.repeat):
                model = make_model()
                est = TorchEstimator(
                    num_proc=size, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
                    loss=torch.nn.MSELoss(), feature_cols=["f"], label_cols=["y"], store=store,
                    batch_size=opts.batch, epochs=opts.epochs, shuffle=False, verbose=0,
                )  # fmt: skip
                start = time.perf_counter()
                result, _ = fit(df, est._values(), f"bench{size}_{i}")
                est_wall.append(time.perf_counter() - start)
                est_epoch += result["epoch_s"]
                start = time.perf_counter()
                args = (x, y, opts.batch, opts.epochs, make_model())
                peer_epoch += hpcring.spark.run(plain_loop, args=args, num_proc=size)[0]
                peer_wall.append(time.perf_counter() - start)
            e, p = statistics.median(est_epoch), statistics.median(peer_epoch)
            fit_s, run_s = statistics.median(est_wall), statistics.median(peer_wall)
            print(
                f"N={size}: epoch {e * 1e3:.1f} ms (estimator) vs {p * 1e3:.1f} ms (in-memory loop), ratio "
                f"{e / p:.2f}x; whole fit {fit_s:.1f} s vs run {run_s:.1f} s"
                f" ({opts.rows} rows, batch {opts.batch}, {opts.epochs} epochs x {opts.repeat} launches)",
                flush=True,
            )
    finally:
        session.stop()


if __name__ == "__main__":
    main()
