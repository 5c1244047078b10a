"""Where a CPU training step's time goes, phase by phase, with the page faults each phase takes.

    hpcring run -np 2 -- python benchmarks/bench_malloc_policy.py --model resnet
    HPCRING_HEAP_TUNING=0 hpcring run -np 2 -- python benchmarks/bench_malloc_policy.py --model resnet

Two copies of one model train in the same process on the same batches, steps alternating: `plain` (torch's
SGD, no communication) and `distopt` (hpcring's DistributedOptimizer). For each phase (forward, backward,
synchronize, the optimizer's step) rank 0 prints the median wall time and the median number of minor page
faults its main thread took (`getrusage(RUSAGE_THREAD)`). The allocator's thresholds are process-wide, so
the two settings of `HPCRING_HEAP_TUNING` (hpcring/malloc_policy.py) take two launches; `plain` is the
control for the machine's load in each. This is the profile behind docs/dev/engine.md, "The heap".
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import hpcring.torch as hvd
from hpcring import malloc_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_models  # benchmarks/ is not a package: its directory is put on the path above

PHASES = ("forward", "backward", "synchronize", "step")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _step(
    model: torch.nn.Module, opt: Any, reduces: bool, x: torch.Tensor, y: torch.Tensor
) -> list[tuple[float, int]]:
    """One training step; (seconds, minor faults) of each phase."""
    marks = [(time.perf_counter(), _faults())]
    opt.zero_grad()
    out = model(x)
    marks.append((time.perf_counter(), _faults()))
    F.cross_entropy(out, y).backward()
    marks.append((time.perf_counter(), _faults()))
    if reduces:
        opt.synchronize()
    marks.append((time.perf_counter(), _faults()))
    if reduces:
        with opt.skip_synchronize():
            opt.step()
    else:
        opt.step()
    marks.append((time.perf_counter(), _faults()))
    return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(marks)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    plain = ddp_models.build(args.model)
    ours = ddp_models.build(args.model)
    hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
    trainers: dict[str, tuple[torch.nn.Module, Any, bool]] = {
        "plain": (plain, torch.optim.SGD(plain.parameters(), lr=0.01), False),
        "distopt": (
            ours,
            hvd.DistributedOptimizer(
                torch.optim.SGD(ours.parameters(), lr=0.01), named_parameters=ours.named_parameters()
            ),
            True,
        ),
    }
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    rows: dict[str, list[list[tuple[float, int]]]] = {k: [] for k in trainers}
    for i in range(args.warmup + args.steps):
        x, y = ddp_models.batch(args.model, args.batch_size, gen)
        for name in trainers if i % 2 == 0 else reversed(list(trainers)):
            hvd.allreduce(torch.zeros(1), name="bench_heap.barrier")  # every rank starts the step together
            phases = _step(*trainers[name], x, y)
            if i >= args.warmup:
                rows[name].append(phases)
    result: dict[str, Any] = {"size": hvd.size(), "model": args.model, "heap": malloc_policy.state()}
    for name, steps in rows.items():
        result[name] = {
            phase: {
                "ms": round(1e3 * statistics.median(s[j][0] for s in steps), 2),
                "faults": statistics.median(s[j][1] for s in steps),
            }
            for j, phase in enumerate(PHASES)
        }
        result[name]["step_ms"] = round(1e3 * statistics.median(sum(p[0] for p in s) for s in steps), 2)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(ddp_models.MODELS), default="resnet")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    result = run(args)
    if hvd.rank() == 0:
        print(f"size {result['size']}  model {args.model}  heap: {result['heap']}")
        for name in ("plain", "distopt"):
            cells = "  ".join(
                f"{ph} {result[name][ph]['ms']} ms / {result[name][ph]['faults']:g} faults" for ph in PHASES
            )
            print(f"{name:8s} step {result[name]['step_ms']} ms: {cells}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
