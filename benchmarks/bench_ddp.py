"""Step time of hpcring's DistributedOptimizer against PyTorch DistributedDataParallel (gloo), same job.

    hpcring run -np 2 -- python benchmarks/bench_ddp.py

One launch runs both: every rank initialises hpcring (MPI) and torch.distributed with the gloo backend (from
the MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE the launcher exports), builds the same model twice from one seed
and trains each on the same batches. Steps alternate (hpcring, DDP, compute-only, then the reverse order), so
load from anything else on the machine hits both alike; step i of hpcring over step i of DDP is one paired
ratio, and the median paired ratio is the headline (target: <= 1.0, i.e. no slower than DDP). The
compute-only model (no communication) shows how much of a step is communication at all. At the end the two
models must hold the same weights: both implement the same synchronous SGD, so a difference would mean one
of them is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import hpcring.torch as hvd


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps", type=int, default=_env_int("HPCRING_BENCH_STEPS", 150), help="timed steps of each"
    )
    p.add_argument(
        "--warmup", type=int, default=_env_int("HPCRING_BENCH_WARMUP", 5), help="untimed steps first"
    )
    p.add_argument("--batch-size", type=int, default=_env_int("HPCRING_BENCH_BATCH", 64), help="per rank")
    p.add_argument("--hidden", type=int, default=_env_int("HPCRING_BENCH_HIDDEN", 1024), help="MLP width")
    p.add_argument("--layers", type=int, default=_env_int("HPCRING_BENCH_LAYERS", 4), help="hidden layers")
    p.add_argument(
        "--json", type=Path, default=os.environ.get("HPCRING_BENCH_JSON"), help="rank 0 writes here"
    )
    return p.parse_args(argv)


def make_model(hidden: int, layers: int) -> torch.nn.Module:
    """An MLP on 784 inputs: `layers` hidden layers of `hidden` units (4 x 1024: about 4M parameters)."""
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = [torch.nn.Linear(784, hidden), torch.nn.ReLU()]
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(*mods)


class Trainer:
    """One model + optimizer + its own batch stream, advanced one step at a time."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int, seed: int) -> None:
        self.model, self.opt, self.batch = model, opt, batch
        self.gen = torch.Generator().manual_seed(seed)

    def step(self) -> None:
        x = torch.randn(self.batch, 784, generator=self.gen)
        y = torch.randint(0, 10, (self.batch,), generator=self.gen)
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()


def time_step(step: Callable[[], None]) -> float:
    """Wall time of one step; a barrier ends it, so the slowest rank sets the pace (as in training)."""
    t0 = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - t0


def build(args: argparse.Namespace) -> dict[str, Trainer]:
    seed = 1000 + hvd.rank()  # each rank its own data, identical for the three trainers
    lr = 0.01

    ours = make_model(args.hidden, args.layers)
    hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=lr), named_parameters=ours.named_parameters()
    )

    ddp = DistributedDataParallel(make_model(args.hidden, args.layers))
    local = make_model(args.hidden, args.layers)
    return {
        "hpcring": Trainer(ours, opt, args.batch_size, seed),
        "ddp": Trainer(ddp, torch.optim.SGD(ddp.parameters(), lr=lr), args.batch_size, seed),
        "compute-only": Trainer(local, torch.optim.SGD(local.parameters(), lr=lr), args.batch_size, seed),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    trainers = build(args)
    for t in trainers.values():
        for _ in range(args.warmup):
            t.step()
    times: dict[str, list[float]] = {name: [] for name in trainers}
    names = list(trainers)
    for i in range(args.steps):
        for name in names if i % 2 == 0 else reversed(names):  # neither always goes first
            times[name].append(time_step(trainers[name].step))
    # Paired ratios: step i of hpcring against step i of DDP, taken moments apart under the same load.
    ratios = sorted(h / d for h, d in zip(times["hpcring"], times["ddp"], strict=True))
    ddp_model = trainers["ddp"].model.module  # type: ignore[union-attr]
    with torch.no_grad():
        pairs = zip(trainers["hpcring"].model.parameters(), ddp_model.parameters(), strict=True)
        diff = max(float((a - b).abs().max()) for a, b in pairs)
    n_params = sum(p.numel() for p in trainers["hpcring"].model.parameters())
    return {
        "size": hvd.size(),
        "params": n_params,
        "gradient_mib": round(n_params * 4 / 2**20, 2),
        "batch_size_per_rank": args.batch_size,
        "paired_steps": args.steps,
        "median_step_ms": {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()},
        "ratio_hpcring_over_ddp": {
            "median": round(statistics.median(ratios), 3),
            "p25": round(ratios[len(ratios) // 4], 3),
            "p75": round(ratios[(3 * len(ratios)) // 4], 3),
        },
        "max_weight_difference": diff,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("gloo", init_method="env://", rank=hvd.rank(), world_size=hvd.size())
    try:
        result = run(args)
    finally:
        dist.destroy_process_group()
    if hvd.rank() == 0:
        ms, ratio = result["median_step_ms"], result["ratio_hpcring_over_ddp"]
        print(
            f"size {result['size']}  params {result['params']} ({result['gradient_mib']} MiB of gradients)  "
            f"batch {args.batch_size}/rank\n"
            f"median step: hpcring {ms['hpcring']} ms, DDP(gloo) {ms['ddp']} ms, "
            f"compute-only {ms['compute-only']} ms\n"
            f"hpcring/DDP ratio: median {ratio['median']} (quartiles {ratio['p25']}..{ratio['p75']})  "
            f"max weight difference {result['max_weight_difference']:.2e}",
            flush=True,
        )
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
