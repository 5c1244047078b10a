"""Allreduce timings per algorithm and size, run in every rank (benchmarks/netns_hierarchical.sh launches it).

Each measurement: barrier, one allreduce, then the slowest rank's time (an allreduce is done when the last
rank has its result). Each (algorithm, size) is warmed up once and then timed `--repeats` times; rank 0 writes
every sample as JSON lines and prints a table of medians, with hierarchical and native against the flat ring.

With --stages, the hierarchical algorithm's three stages are also timed one by one on the whole buffer
(intra-node ring reduce-scatter, cross-node allreduce of each shard, intra-node ring allgather), separated by
barriers: what the pipelined algorithm overlaps.

Runs with numpy buffers only, so it works in the MPICH venv too (no torch there).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpcring import collective as hc

ALGORITHMS = ("native", "ring", "hierarchical")


def slowest(seconds: float) -> float:
    """The largest of every rank's `seconds` (native MPI max: tiny and not what is being measured)."""
    out = hc.allreduce(np.array([seconds]), op=hc.ReduceOp.MAX, algorithm="native")
    return float(out[0])


def timed(fn: Callable[[], object]) -> float:
    """Slowest rank's time for one call of fn, starting together after a barrier."""
    hc.barrier()
    t0 = time.perf_counter()
    fn()
    return slowest(time.perf_counter() - t0)


def stage_times(x: np.ndarray[Any, Any]) -> dict[str, float]:
    """The three stages of hpcring's hierarchical allreduce on the whole buffer, each timed on its own
    (barrier-separated), with the same functions the algorithm runs when it does not pipeline."""
    from hpcring.collective.algorithms.chunks import bounds, offsets
    from hpcring.collective.algorithms.hierarchical import flat_allreduce, local_counts
    from hpcring.collective.algorithms.ring import DEFAULT_CHUNK_BYTES, ring_allgather, ring_reduce_scatter

    layout = hc.topology().node_layout()
    local = layout.local
    counts = local_counts(x.size, layout.shards, local.size)
    lo = sum(counts[: local.rank])
    dst = np.empty_like(x)
    mine = dst[lo : lo + counts[local.rank]]
    sb = bounds(x.size, layout.shards)
    chunk = DEFAULT_CHUNK_BYTES
    out = {
        "reduce_scatter": timed(
            lambda: ring_reduce_scatter(local, x, mine, offsets(counts), hc.ReduceOp.SUM, chunk)
        )
    }

    def cross() -> None:
        for shard in sorted(layout.shard_groups):
            flat_allreduce(layout.shard_groups[shard], dst[sb[shard] : sb[shard + 1]], hc.ReduceOp.SUM)

    out["cross_allreduce"] = timed(cross)
    out["allgather"] = timed(lambda: ring_allgather(local, dst, offsets(counts), chunk // x.dtype.itemsize))
    return out


def run(sizes: list[int], repeats: int, algorithms: list[str], stages: bool) -> list[dict[str, Any]]:
    """All samples: one record per (algorithm, size) with every repeat's time, the same on every rank.

    Repeats are interleaved (round r times every algorithm once) so that load from other processes on the
    machine hits all algorithms alike instead of whichever happened to run during a busy spell.
    """
    records: list[dict[str, Any]] = []
    want = hc.size() * (hc.size() + 1) / 2
    for nbytes in sizes:
        x = np.full(nbytes // 4, float(hc.rank() + 1), dtype=np.float32)
        samples: dict[str, list[float]] = {a: [] for a in algorithms}
        for algorithm in algorithms:
            out = hc.allreduce(x, algorithm=algorithm)  # warm-up: connections, buffers, first-touch
            assert out[0] == want and out[-1] == want, (algorithm, out[:4])
        if stages:
            stage_times(x)  # warm-up
        for _ in range(repeats):
            for algorithm in algorithms:
                samples[algorithm].append(timed(functools.partial(hc.allreduce, x, algorithm=algorithm)))
            if stages:
                for name, seconds in stage_times(x).items():
                    samples.setdefault(f"hierarchical:{name}", []).append(seconds)
        records += [{"algorithm": a, "bytes": nbytes, "seconds": t} for a, t in samples.items()]
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Markdown table of medians (and min..max), with each algorithm's speed-up over the flat ring."""
    med = {(r["algorithm"], r["bytes"]): statistics.median(r["seconds"]) for r in records}
    lines = [
        "| size | algorithm | median s | min..max s | busbw Gbit/s | speed-up vs ring |",
        "|---:|---|---:|---|---:|---:|",
    ]
    n = hc.size()
    for r in records:
        key = (r["algorithm"], r["bytes"])
        ring = med.get(("ring", r["bytes"]))
        speedup = f"{ring / med[key]:.2f}x" if ring and ":" not in r["algorithm"] else ""
        stage = ":" in r["algorithm"]
        busbw = "" if stage else f"{r['bytes'] * 8 / med[key] / 1e9 * 2 * (n - 1) / n:.2f}"
        lines.append(
            f"| {r['bytes'] / 2**20:g} MiB | {r['algorithm']} | {med[key]:.3f} | "
            f"{min(r['seconds']):.3f}..{max(r['seconds']):.3f} | {busbw} | {speedup} |"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes-mib", default="1,4,16,64", help="comma-separated buffer sizes in MiB")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per algorithm and size (median)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--stages", action="store_true", help="also time the hierarchical stages")
    parser.add_argument("--json", type=Path, help="rank 0 appends one JSON record per (algorithm, size)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hc.init()
    sizes = [int(float(s) * 2**20) for s in args.sizes_mib.split(",")]
    records = run(sizes, args.repeats, args.algorithms.split(","), args.stages)
    if hc.rank() != 0:
        return
    topo = {"size": hc.size(), "local_size": hc.local_size(), "cross_size": hc.cross_size()}
    meta = {
        "host": socket.gethostname(),
        **topo,
        "rate": os.environ.get("HPCRING_BENCH_RATE", ""),
        "segment_bytes": os.environ.get("HPCRING_HIER_SEGMENT_BYTES", "default"),
        "loadavg": os.getloadavg()[0],
    }
    if args.json:
        with args.json.open("a") as f:
            for r in records:
                f.write(json.dumps({**meta, **r}) + "\n")
    print(
        f"allreduce float32, {topo['cross_size']} nodes x {topo['local_size']} ranks, {args.repeats} repeats"
    )
    print(table(records), flush=True)


if __name__ == "__main__":
    main()
