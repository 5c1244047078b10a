"""The engine thread's CPU time per small async op: what each op costs the cores beside the training thread.

    hpcring run -np 2 -- python benchmarks/bench_engine_cpu.py --ops 3000 --json engine_cpu.json   # and -np 1

The main thread issues `hvd.allreduce_async_` of a `--bytes` float32 tensor every `--period-ms` (sleeping
in between, so it leaves the cores to the engine) and synchronizes the handle it submitted `--depth` ops
before, as a training loop reporting metrics does. After a warm-up, per rank: the CPU time of the engine
thread (`hpcring-engine`, from /proc/self/task/TID/schedstat) and of the main thread per op, the wall time
per op, and how many of the engine's cycles were the compiled core's plain ones (`stats["lone"]`, 0 on the
pure-Python path and on code before it). Only the public API and the engine's counters are read, so
`PYTHONPATH` pointing at another checkout times that code in the same sitting (docs/dev/bench-engine.md).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import torch

import hpcring.torch as hvd
from hpcring.torch import basics


def engine_cpu_ns() -> int:
    """CPU time the engine thread has run, in ns (0 when it is not found)."""
    for t in threading.enumerate():
        if t.name == "hpcring-engine" and t.native_id is not None:
            with open(f"/proc/self/task/{t.native_id}/schedstat", encoding="ascii") as f:
                return int(f.read().split()[0])
    return 0


def run(ops: int, nbytes: int, period_s: float, depth: int) -> dict[str, float]:
    """`ops` paced async allreduces with `depth` in flight; per-op times in microseconds."""
    x = torch.ones(max(1, nbytes // 4))
    pending: list[int] = []
    names = [f"bench.engine_cpu.{i}" for i in range(depth + 1)]  # a name is never in flight twice
    e0, m0, t0 = engine_cpu_ns(), time.thread_time_ns(), time.perf_counter()
    for i in range(ops):
        pending.append(hvd.allreduce_async_(x, name=names[i % len(names)], op=hvd.Sum))
        if len(pending) > depth:
            hvd.synchronize(pending.pop(0))
        time.sleep(period_s)
    for h in pending:
        hvd.synchronize(h)
    e1, m1, t1 = engine_cpu_ns(), time.thread_time_ns(), time.perf_counter()
    return {
        "engine_cpu_us_per_op": (e1 - e0) / ops / 1e3,
        "main_cpu_us_per_op": (m1 - m0) / ops / 1e3,
        "wall_us_per_op": (t1 - t0) / ops * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--period-ms", type=float, default=1.0)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    hvd.init()
    run(args.warmup, args.bytes, args.period_ms / 1000.0, args.depth)
    stats = basics.engine().stats
    lone0, cycles0 = stats.get("lone", 0), stats["cycles"]
    result: dict[str, Any] = run(args.ops, args.bytes, args.period_ms / 1000.0, args.depth)
    result["plain_cycles_share"] = (stats.get("lone", 0) - lone0) / max(1, stats["cycles"] - cycles0)
    rows = hvd.allgather_object(result)
    if hvd.rank() == 0:
        out = {"size": hvd.size(), "settings": vars(args) | {"json": str(args.json)}, "ranks": rows}
        print(json.dumps(out, indent=1))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    hvd.shutdown()


if __name__ == "__main__":
    main()
