"""`hpcring.torch` ops against raw mpi4py `Allreduce` in the same launch: the issue-13 rows.

    hpcring run -np 2 -- python benchmarks/bench_torch_ops.py --size 64M --repeats 9

1. Many small tensors: 256 x 16 KiB float32, `allreduce_async_` on each then `synchronize` on each, against
   256 raw `comm.Allreduce` calls on the same arrays (ratio raw / hpcring: > 1 means hpcring is faster);
   also the same 256 as one `grouped_allreduce_async_` (Horovod's grouped call) and its `synchronize`.
2. Out of place, `--size` bytes of float32. Per repetition, in alternating order: `hvd.allreduce(x)` (a
   new output tensor every call, as a user gets), `hvd.allreduce_(x)` (in place), raw
   `comm.Allreduce(x, out)` into a new numpy array every call (the allocation the out-of-place op pays)
   and into one output allocated once. The headline is raw-into-new-output time over hpcring's
   out-of-place time (> 1: hpcring faster), the median of the per-repetition ratios.

Every time is the slowest rank's (a barrier before, an allreduce of the elapsed time after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

import hpcring.torch as hvd
from hpcring.config import parse_bytes


def _timed(comm: Any, fn: Callable[[], object]) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return float(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))


def _many_small(comm: Any, repeats: int, count: int = 256, nbytes: int = 16 << 10) -> dict[str, Any]:
    """Row 1: `count` in-place async allreduces of `nbytes` each, then their synchronizes, against the same
    number of raw blocking Allreduce calls; median step times and the median per-repetition ratio, and the
    caller's time per `allreduce_async_` call (this rank's submit loop over `count`: the per-call Python),
    named as a training loop names its tensors and, in extra steps outside the timed ones, unnamed."""
    tensors = [torch.full((nbytes // 4,), float(hvd.rank())) for _ in range(count)]
    arrays = [t.numpy() for t in tensors]
    submit_s: list[float] = []
    unnamed_s: list[float] = []

    def ours() -> None:
        t0 = time.perf_counter()
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"many.{i}") for i, t in enumerate(tensors)]
        submit_s.append(time.perf_counter() - t0)
        for h in handles:
            hvd.synchronize(h)

    def ours_unnamed() -> None:
        t0 = time.perf_counter()
        handles = [hvd.allreduce_async_(t, op=hvd.Sum) for t in tensors]
        unnamed_s.append(time.perf_counter() - t0)
        for h in handles:
            hvd.synchronize(h)

    def grouped() -> None:
        t0 = time.perf_counter()
        handle = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum, name="many.grouped")
        grouped_s.append(time.perf_counter() - t0)
        hvd.synchronize(handle)

    def raw() -> None:
        for a in arrays:
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    grouped_s: list[float] = []
    runs: dict[str, Callable[[], None]] = {"ours": ours, "raw": raw, "grouped": grouped}
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(3 * repeats):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(_timed(comm, runs[name]))
    for _ in range(repeats + 1):
        ours_unnamed()
    t_ours, t_raw, t_grouped = times["ours"], times["raw"], times["grouped"]
    return {
        "many_small_median_ms": {
            "hpcring_async": round(1e3 * statistics.median(t_ours), 2),
            "hpcring_grouped": round(1e3 * statistics.median(t_grouped), 2),
            "raw_loop": round(1e3 * statistics.median(t_raw), 2),
        },
        "many_small_grouped_submit_us_per_tensor": round(1e6 * statistics.median(grouped_s[1:]) / count, 2),
        "many_small_raw_over_grouped": round(
            statistics.median(r / g for r, g in zip(t_raw, t_grouped, strict=True)), 3
        ),
        "many_small_submit_us_per_call": round(
            1e6 * statistics.median(submit_s[1:]) / count, 2
        ),  # no warm-up
        "many_small_submit_unnamed_us_per_call": round(1e6 * statistics.median(unnamed_s[1:]) / count, 2),
        "many_small_raw_over_hpcring": round(
            statistics.median(r / h for r, h in zip(t_raw, t_ours, strict=True)), 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="64M", help="bytes of float32 per allreduce (64M, 1MiB, 4096, ...)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the result here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    n = parse_bytes("--size", args.size) // 4
    x = torch.full((n,), float(hvd.rank() + 1))
    xa = x.numpy()
    fixed = np.empty_like(xa)
    cases: dict[str, Callable[[], object]] = {
        "hpcring_out_of_place": lambda: hvd.allreduce(x, op=hvd.Sum, name="oop"),
        "hpcring_in_place": lambda: hvd.allreduce_(x, op=hvd.Sum, name="ip"),
        "raw_new_output": lambda: comm.Allreduce(xa, np.empty_like(xa), op=MPI.SUM),
        "raw_fixed_output": lambda: comm.Allreduce(xa, fixed, op=MPI.SUM),
    }
    for fn in cases.values():  # warm-up: caches, communicators, the engine's response cache
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(args.repeats):
        for name in list(cases) if i % 2 == 0 else reversed(list(cases)):
            times[name].append(_timed(comm, cases[name]))
    many = _many_small(comm, args.repeats)
    ratios = [r / h for r, h in zip(times["raw_new_output"], times["hpcring_out_of_place"], strict=True)]
    result = {
        "size": hvd.size(),
        "bytes": n * 4,
        "median_ms": {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()},
        "raw_new_over_hpcring_out_of_place": round(statistics.median(ratios), 3),
        "raw_fixed_over_hpcring_out_of_place": round(
            statistics.median(
                r / h for r, h in zip(times["raw_fixed_output"], times["hpcring_out_of_place"], strict=True)
            ),
            3,
        ),
        **many,
    }
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
