"""Engine benchmarks: what tensor fusion buys, and what the engine costs per operation.

Run under the launcher, e.g.:

    hpcring run -np 2 -- python benchmarks/bench_engine.py
    hpcring run -np 4 -- python benchmarks/bench_engine.py --json engine.json

1. Fusion: 256 tensors of 16 KiB (float32) allreduced through the engine
   - fused: all submitted at once, default fusion threshold (64 MiB): one 4 MiB collective per step;
   - one by one: fusion off (threshold 0), each allreduce submitted and waited for before the next;
   - unfused async (for reference): fusion off, all 256 submitted at once: 256 collectives per cycle;
   - fused adjacent: as fused, but the 256 inputs (and the 256 outputs) are back-to-back views of one
     buffer each, as gradients laid out in buckets (DDP's `gradient_as_bucket_view`) are: the engine then
     reduces them where they lie, with no copy into or out of the fusion buffer. A separate row: the issue's
     figure is `fused` (256 independently allocated tensors).
   - data floor (for reference, one node only): the same request building, then only the data movement the
     fused step does through shared memory (pack into the slot, reduce, unpack; `shm_round`) with no engine
     at all: what a fused step would cost if negotiation, planning and completion were free. One by one over
     the floor is the most fusion could show on this machine.
2. Latency of a 4-byte allreduce: the engine (submit + wait, response cache warm) against raw mpi4py
   `Allreduce` on the same ranks, i.e. the engine's overhead per operation.

Each figure is the median over iterations of the slowest rank's time (max over ranks per iteration). Ranks are
lined up with a barrier on a separate communicator before every iteration. The engine is used directly on
numpy arrays (framework-agnostic), so the benchmark also runs in an environment without torch.

Every step builds new requests (names, signatures, handles), as a training step does. The results go to
output arrays allocated once, as a training step reduces into the same gradient memory every step
(`DistributedOptimizer` reduces `p.grad` in place). `--fresh-outputs` allocates new output arrays every step
instead (the method of the first version of this benchmark): the first write to fresh memory then costs page
faults, about as much as the rest of a fused step on the CI machine, in both modes alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hpcring
from hpcring.collective.algorithms.shm import shm_round
from hpcring.collective.ops import ReduceOp
from hpcring.config import EngineSettings, engine_settings
from hpcring.engine import Engine, OpType, Request, Signature
from hpcring.engine.host_buffers import _unpack

TENSORS = 256
TENSOR_BYTES = 16 * 1024


def allreduce_requests(tag: str, arrays: list[np.ndarray], outputs: list[np.ndarray]) -> list[Request]:
    """One allreduce request per array, into `outputs`."""
    return [
        Request(Signature(f"{tag}.{i}", OpType.ALLREDUCE, "float32", a.shape, "sum"), 0, a, out)
        for i, (a, out) in enumerate(zip(arrays, outputs, strict=True))
    ]


def timed(comm: Any, iters: int, warmup: int, step: Callable[[], None]) -> list[float]:
    """Per-iteration time of the slowest rank, in seconds."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        step()
        out.append(comm.allreduce(time.perf_counter() - t0, op=max_op()))
    return out


def max_op() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def adjacent_views(n: int, count: int) -> list[np.ndarray]:
    """`n` back-to-back views of `count` float32 elements each, over one new buffer."""
    flat = np.empty(n * count, np.float32)
    return [flat[i * count : (i + 1) * count] for i in range(n)]


def new_outputs(arrays: list[np.ndarray], adjacent: bool) -> list[np.ndarray]:
    """Output arrays for `arrays`: laid out like them (back to back in one buffer, or separately)."""
    if adjacent:
        return adjacent_views(len(arrays), arrays[0].size)
    return [np.empty_like(a) for a in arrays]


def bench_fusion(world: Any, iters: int, fresh_outputs: bool = False) -> dict[str, float]:
    n = world.size
    count = TENSOR_BYTES // 4
    separate = [np.full(count, float(world.rank + i), np.float32) for i in range(TENSORS)]
    adjacent = adjacent_views(TENSORS, count)
    for i, view in enumerate(adjacent):
        view[...] = float(world.rank + i)
    want0 = float(n * (n - 1) // 2)
    results: dict[str, float] = {}
    base = engine_settings()
    threshold = base.fusion_threshold or 64 << 20
    variants = {
        "fused": (threshold, "all", separate),
        "one_by_one": (0, "sync", separate),
        "unfused_async": (0, "all", separate),
        "fused_adjacent": (threshold, "all", adjacent),
    }
    for label, (limit, mode, arrays) in variants.items():
        outputs = None if fresh_outputs else new_outputs(arrays, arrays is adjacent)
        engine = Engine(world, EngineSettings(fusion_threshold=limit, cycle_time_ms=base.cycle_time_ms))
        try:

            def step(
                engine: Engine = engine,
                mode: str = mode,
                arrays: list[np.ndarray] = arrays,
                outputs: list[np.ndarray] | None = outputs,
            ) -> None:
                if outputs is None:
                    outputs = new_outputs(arrays, arrays is adjacent)
                reqs = allreduce_requests("fusion", arrays, outputs)
                if mode == "all":
                    engine.submit_many(reqs)
                    for r in reqs:
                        r.handle.wait()
                else:
                    for r in reqs:
                        engine.submit(r)
                        r.handle.wait()
                first, last = reqs[0].output, reqs[-1].output
                assert first is not None and first[0] == want0
                assert last is not None and last[0] == want0 + n * (TENSORS - 1)

            times = timed(world.comm, iters, 2, step)
            results[label] = statistics.median(times)
        finally:
            engine.shutdown()
    floor = data_floor_step(world, separate, new_outputs(separate, False))
    if floor is not None:
        results["data_floor"] = statistics.median(timed(world.comm, iters, 2, floor))
    return results


def data_floor_step(
    world: Any, arrays: list[np.ndarray], outputs: list[np.ndarray]
) -> Callable[[], None] | None:
    """A fused step without the engine: build the requests as the engine rows do, then move the data as the
    engine's shared-memory path does (pack into this rank's slot, reduce this rank's part, unpack). None where
    the ranks share no segment (several nodes, one rank)."""
    seg = world.shared_segment()
    dtype = np.dtype(np.float32)
    total = sum(a.size for a in arrays)
    if seg is None or not seg.ensure(total * dtype.itemsize):
        return None
    counts = [a.size for a in arrays]
    want = float(world.size * (world.size - 1) // 2)

    def fill(slot: np.ndarray) -> None:
        np.concatenate(arrays, axis=None, out=slot)

    def drain(result: np.ndarray) -> None:
        _unpack(result, counts, outputs)

    def step() -> None:
        reqs = allreduce_requests("fusion", arrays, outputs)
        shm_round(seg, total, dtype, ReduceOp.SUM, fill, drain)
        assert reqs[0].tensor is arrays[0] and outputs[0][0] == want

    return step


def bench_latency(world: Any, iters: int) -> dict[str, float]:
    from mpi4py import MPI

    x = np.ones(1, np.float32)
    y = np.empty_like(x)
    comm = world.comm.Dup()
    raw = timed(world.comm, iters, 20, lambda: comm.Allreduce(x, y, op=MPI.SUM))
    comm.Free()
    engine = Engine(world, engine_settings())
    try:

        def step() -> None:
            engine.submit(allreduce_requests("latency", [x], [np.empty_like(x)])[0]).wait()

        def step_inline() -> None:  # what hpcring.torch's synchronize does: the waiter runs the cycle
            with engine.deferred_wake():
                handle = engine.submit(allreduce_requests("latency", [x], [np.empty_like(x)])[0])
            engine.run_inline(handle, deferred=True)
            handle.wait()

        through = timed(world.comm, iters, 20, step)
        inline = timed(world.comm, iters, 20, step_inline)
    finally:
        engine.shutdown()
    return {
        "raw_mpi4py": statistics.median(raw),
        "engine": statistics.median(through),
        "engine_inline": statistics.median(inline),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=int(os.environ.get("HPCRING_BENCH_ITERS", "20")))
    parser.add_argument("--latency-iters", type=int, default=500)
    parser.add_argument("--json", help="write the results as JSON to this path (rank 0)")
    parser.add_argument(
        "--fresh-outputs",
        action="store_true",
        default=os.environ.get("HPCRING_BENCH_FRESH_OUTPUTS", "") not in ("", "0"),
        help="allocate new output arrays every step (page faults included in every figure)",
    )
    args = parser.parse_args(argv)
    world = hpcring.init()
    fusion = bench_fusion(world, args.iters, args.fresh_outputs)
    latency = bench_latency(world, args.latency_iters)
    if world.rank == 0:
        from mpi4py import MPI

        mb = TENSORS * TENSOR_BYTES / 2**20
        s = engine_settings()
        print(
            f"ranks={world.size} nodes={len(world.node_sizes)} "
            f"mpi={MPI.Get_library_version().splitlines()[0]}"
        )
        print(f"engine: cycle {s.cycle_time_ms} ms, fusion threshold {s.fusion_threshold} B")
        print(f"outputs: {'new arrays every step' if args.fresh_outputs else 'allocated once'}")
        print(
            f"\n{TENSORS} x {TENSOR_BYTES // 1024} KiB float32 allreduce ({mb:.0f} MiB per step), "
            f"median of {args.iters}:"
        )
        for label, t in fusion.items():
            print(f"  {label:<14} {t * 1e3:9.2f} ms")
        print(f"  fused vs one by one:          {fusion['one_by_one'] / fusion['fused']:6.1f}x")
        print(f"  fused vs unfused async:       {fusion['unfused_async'] / fusion['fused']:6.1f}x")
        print(f"  fused adjacent vs one by one: {fusion['one_by_one'] / fusion['fused_adjacent']:6.1f}x")
        if "data_floor" in fusion:
            print(f"  data floor vs one by one:     {fusion['one_by_one'] / fusion['data_floor']:6.1f}x")
            print(f"  fused over the data floor:    {(fusion['fused'] - fusion['data_floor']) * 1e3:6.2f} ms")
        print(f"\n4-byte allreduce latency, median of {args.latency_iters}:")
        print(f"  raw mpi4py     {latency['raw_mpi4py'] * 1e6:9.1f} us")
        print(f"  engine         {latency['engine'] * 1e6:9.1f} us  (the engine thread runs the cycle)")
        print(f"  engine inline  {latency['engine_inline'] * 1e6:9.1f} us  (the waiting thread runs it)")
        print(f"  engine overhead {(latency['engine'] - latency['raw_mpi4py']) * 1e6:8.1f} us per op")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(
                    {
                        "ranks": world.size,
                        "fresh_outputs": args.fresh_outputs,
                        "fusion_s": fusion,
                        "latency_s": latency,
                    },
                    f,
                    indent=2,
                )
    hpcring.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
