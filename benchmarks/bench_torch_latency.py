"""Latency of small synchronous `hpcring.torch` ops: what a user's `hvd.allreduce(metric)` costs.

    hpcring run -np 2 -- python benchmarks/bench_torch_latency.py --ops 2000

Per op (4-byte float32: `allreduce_` in place, named and unnamed, `allreduce` out of place,
`synchronize(allreduce_async_(...))`, `allgather`, `broadcast`), the median of `--ops` back-to-back calls on
rank 0 after a warm-up (no barrier between calls, as a training loop calls them), in microseconds. Only the
public API is used, so the same script times any version of the code (`PYTHONPATH` pointing at another
checkout) in the same sitting.

On a machine shared with other jobs a rank that loses its core for a while turns a run's median into the
time of a descheduled peer, so each op also reports `quiet`: the lowest median of its calls taken in windows
of `--window` consecutive calls (the stretch the other jobs left alone), and `p25`, the lower quartile of all
calls.
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


def timed_us(fn: Callable[[], object], ops: int) -> list[float]:
    """Per-call times of `ops` calls after a warm-up, in microseconds."""
    for _ in range(min(200, ops)):
        fn()
    times = []
    for _ in range(ops):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return [t * 1e6 for t in times]


def summary(times: list[float], window: int) -> dict[str, float]:
    """Median, lower quartile, and the quietest window's median (see the module docstring)."""
    windows = [times[i : i + window] for i in range(0, len(times) - window + 1, window)] or [times]
    return {
        "median": round(statistics.median(times), 2),
        "p25": round(statistics.quantiles(times, n=4)[0], 2),
        "quiet": round(min(statistics.median(w) for w in windows), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--window", type=int, default=200, help="calls per window of the `quiet` figure")
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the result here")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    x = torch.ones(1)
    rows = {
        "allreduce_": lambda: hvd.allreduce_(x, op=hvd.Sum, name="lat.in_place"),
        "allreduce_unnamed": lambda: hvd.allreduce_(x, op=hvd.Sum),  # a new name each call: never cached
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="lat.out_of_place"),
        # Horovod's async idiom, waited for at once: the waiter runs a lone op's cycle itself
        "async_synchronize": lambda: hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="lat.async")),
        "allgather": lambda: hvd.allgather(x, name="lat.gather"),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0, name="lat.broadcast"),
    }
    stats = {name: summary(timed_us(fn, args.ops), args.window) for name, fn in rows.items()}
    result = {
        "size": hvd.size(),
        "us": {name: s["median"] for name, s in stats.items()},
        "p25_us": {name: s["p25"] for name, s in stats.items()},
        "quiet_us": {name: s["quiet"] for name, s in stats.items()},
    }
    if hvd.rank() == 0:
        print(json.dumps(result))
        if args.json:
            args.json.write_text(json.dumps(result))
    hvd.shutdown()


if __name__ == "__main__":
    main()
