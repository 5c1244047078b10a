"""Latency of small synchronous `hpcring.torch` ops: what a user's `hvd.allreduce(metric)` costs.

    hpcring run -np 2 -- python benchmarks/bench_torch_latency.py --ops 2000

Per op (4-byte float32: `allreduce_` in place, `allreduce` out of place, `allgather`, `broadcast`), the median
of `--ops` back-to-back calls on rank 0 after a warm-up (no barrier between calls, as a training loop calls
them), in microseconds. Only the public API is used, so the same script times any version of the code
(`PYTHONPATH` pointing at another checkout) in the same sitting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import hpcring.torch as hvd


def median_us(fn: Callable[[], object], ops: int) -> float:
    for _ in range(min(200, ops)):
        fn()
    times = []
    for _ in range(ops):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the result here")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    x = torch.ones(1)
    rows = {
        "allreduce_": lambda: hvd.allreduce_(x, op=hvd.Sum, name="lat.in_place"),
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="lat.out_of_place"),
        "allgather": lambda: hvd.allgather(x, name="lat.gather"),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0, name="lat.broadcast"),
    }
    result = {"size": hvd.size(), "us": {name: median_us(fn, args.ops) for name, fn in rows.items()}}
    if hvd.rank() == 0:
        print(json.dumps(result))
        if args.json:
            args.json.write_text(json.dumps(result))
    hvd.shutdown()


if __name__ == "__main__":
    main()
