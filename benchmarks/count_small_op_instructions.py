"""The small-op path's work, for valgrind: N steps of 256 x 16 KiB async allreduces, M 4-byte `allreduce_`.

    hpcring run -np 1 -- env PYTHONHASHSEED=0 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        valgrind --tool=callgrind --callgrind-out-file=cg.5.0 \\
        python benchmarks/count_small_op_instructions.py 5 0

Run it twice with different counts (5 and 25 steps; 200 and 1200 calls) and divide the difference of the two
totals (`callgrind_annotate FILE | grep 'PROGRAM TOTALS'`) by the difference of the counts: start-up cancels,
and what is left is the instructions per tensor or per call, which the machine's load does not change.
Only the public API is used, so `HPCRING_PURE_PYTHON=1` or `PYTHONPATH` pointing at another checkout counts
the other path in the same way (docs/dev/bench-engine.md, "The compiled core").

The submit alone: `--collector-off` and valgrind's `--toggle-collect=Submitter_allreduce` count only inside
the core's one-call submit, so the total divided by steps x 256 is its instructions per call. The cyclic
collector is off because its collections follow every thread's allocations and would be charged to whichever
call crossed the threshold (bench-engine.md, "The submit, trimmed").
"""

from __future__ import annotations

import argparse
import gc

import torch

import hpcring.torch as hvd

TENSORS = 256
ELEMENTS = 4096  # 16 KiB of float32


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("steps", type=int, help="steps of 256 allreduce_async_ + synchronize")
    p.add_argument("calls", type=int, help="4-byte synchronous allreduce_ calls")
    p.add_argument("--collector-off", action="store_true", help="gc.disable() after start-up")
    args = p.parse_args()
    hvd.init()
    if args.collector_off:
        gc.collect()
        gc.disable()
    tensors = [torch.zeros(ELEMENTS) for _ in range(TENSORS)]
    names = [f"many.{i}" for i in range(TENSORS)]
    for _ in range(args.steps):
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=n) for t, n in zip(tensors, names, strict=True)]
        for h in handles:
            hvd.synchronize(h)
    x = torch.zeros(1)
    for _ in range(args.calls):
        hvd.allreduce_(x, op=hvd.Sum, name="latency")


if __name__ == "__main__":
    main()
