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
import contextlib
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import hpcring.torch as hvd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_models  # benchmarks/ is not a package: its directory is put on the path above


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
        "--model",
        choices=sorted(ddp_models.MODELS),
        default=os.environ.get("HPCRING_BENCH_MODEL", "mlp"),
        help="mlp: --layers x --hidden MLP; mlp200, resnet, transformer: see benchmarks/ddp_models.py",
    )
    p.add_argument(
        "--backward-passes",
        type=int,
        default=_env_int("HPCRING_BENCH_BACKWARD_PASSES", 1),
        help="backward_passes_per_step (DDP: no_sync() on all but the last pass)",
    )
    p.add_argument(
        "--compression",
        choices=("none", "fp16"),
        default=os.environ.get("HPCRING_BENCH_COMPRESSION", "none"),
        help="fp16: Compression.fp16 against DDP's fp16_compress_hook",
    )
    p.add_argument(
        "--adasum",
        action="store_true",
        default=os.environ.get("HPCRING_BENCH_ADASUM") == "1",
        help="also train with DistributedOptimizer(op=hvd.Adasum) and report its paired ratio to op=Average",
    )
    p.add_argument(
        "--only",
        choices=("hpcring", "ddp"),
        default=os.environ.get("HPCRING_BENCH_ONLY") or None,
        help="train only this one (with compute-only): peak RSS of a step, one launch per side",
    )
    p.add_argument(
        "--json", type=Path, default=os.environ.get("HPCRING_BENCH_JSON"), help="rank 0 writes here"
    )
    return p.parse_args(argv)


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    """The model of --model (seeded: every call gives the same weights)."""
    if args.model == "mlp":
        torch.manual_seed(0)
        return ddp_models.mlp(args.hidden, args.layers)
    return ddp_models.build(args.model)


class Trainer:
    """One model + optimizer + its own batch stream, advanced one step at a time."""

    def __init__(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, args: argparse.Namespace, seed: int
    ) -> None:
        self.model, self.opt, self.batch, self.kind = model, opt, args.batch_size, args.model
        self.passes = args.backward_passes
        self.gen = torch.Generator().manual_seed(seed)

    def _pass(self) -> None:
        x, y = ddp_models.batch(self.kind, self.batch, self.gen)
        F.cross_entropy(self.model(x), y).backward()

    def step(self) -> None:
        self.opt.zero_grad()
        no_sync = getattr(self.model, "no_sync", None)
        for _ in range(self.passes - 1):
            with no_sync() if no_sync is not None else contextlib.nullcontext():
                self._pass()
        self._pass()
        self.opt.step()


def time_step(step: Callable[[], None]) -> float:
    """Wall time of one step; a barrier ends it, so the slowest rank sets the pace (as in training)."""
    t0 = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - t0


def build(args: argparse.Namespace) -> dict[str, Trainer]:
    """The three trainers (or hpcring/DDP alone with --only), same weights, same batches.

    DDP runs with `broadcast_buffers=False`: DistributedOptimizer does not touch BatchNorm's running
    statistics either, so both move the same data; its other settings are the defaults (25 MiB buckets)."""
    seed = 1000 + hvd.rank()  # each rank its own data, identical for the three trainers
    lr = 0.01
    out: dict[str, Trainer] = {}
    if args.only in (None, "hpcring"):
        ours = make_model(args)
        hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(ours.parameters(), lr=lr),
            named_parameters=ours.named_parameters(),
            backward_passes_per_step=args.backward_passes,
            compression=hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none,
        )
        out["hpcring"] = Trainer(ours, opt, args, seed)
    if args.adasum and args.only is None:
        delta = make_model(args)
        hvd.broadcast_parameters(delta.state_dict(), root_rank=0)
        ada = hvd.DistributedOptimizer(
            torch.optim.SGD(delta.parameters(), lr=lr),
            named_parameters=delta.named_parameters(),
            backward_passes_per_step=args.backward_passes,
            op=hvd.Adasum,
        )
        out["adasum"] = Trainer(delta, ada, args, seed)
    if args.only in (None, "ddp"):
        ddp = DistributedDataParallel(make_model(args), broadcast_buffers=False)
        if args.compression == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        out["ddp"] = Trainer(ddp, torch.optim.SGD(ddp.parameters(), lr=lr), args, seed)
    local = make_model(args)
    out["compute-only"] = Trainer(local, torch.optim.SGD(local.parameters(), lr=lr), args, seed)
    return out


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
    model = trainers["compute-only"].model
    n_params = sum(p.numel() for p in model.parameters())
    result: dict[str, Any] = {
        "size": hvd.size(),
        "model": args.model,
        "gradients": sum(1 for p in model.parameters() if p.requires_grad),
        "params": n_params,
        "gradient_mib": round(n_params * 4 / 2**20, 2),
        "batch_size_per_rank": args.batch_size,
        "backward_passes_per_step": args.backward_passes,
        "compression": args.compression,
        "paired_steps": args.steps,
        "median_step_ms": {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if args.only is not None:
        return result
    # Paired ratios: step i of hpcring against step i of DDP, taken moments apart under the same load.
    ratios = sorted(h / d for h, d in zip(times["hpcring"], times["ddp"], strict=True))
    ddp_model = trainers["ddp"].model.module  # type: ignore[union-attr]
    with torch.no_grad():
        pairs = zip(trainers["hpcring"].model.parameters(), ddp_model.parameters(), strict=True)
        diff = max(float((a - b).abs().max()) for a, b in pairs)
    result["ratio_hpcring_over_ddp"] = {
        "median": round(statistics.median(ratios), 3),
        "p25": round(ratios[len(ratios) // 4], 3),
        "p75": round(ratios[(3 * len(ratios)) // 4], 3),
    }
    result["max_weight_difference"] = diff
    if "adasum" in times:  # Adasum's step against the same optimizer's Average step, paired the same way
        ada = sorted(a / h for a, h in zip(times["adasum"], times["hpcring"], strict=True))
        result["ratio_adasum_over_average"] = {
            "median": round(statistics.median(ada), 3),
            "p25": round(ada[len(ada) // 4], 3),
            "p75": round(ada[(3 * len(ada)) // 4], 3),
        }
    return result


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
        ms = result["median_step_ms"]
        print(
            f"size {result['size']}  model {args.model} ({result['gradients']} gradients)  params "
            f"{result['params']} ({result['gradient_mib']} MiB of gradients)  batch {args.batch_size}/rank  "
            f"backward passes {args.backward_passes}  compression {args.compression}\n"
            f"median step (ms): {ms}  peak RSS {result['peak_rss_mib']} MiB",
            flush=True,
        )
        if "ratio_hpcring_over_ddp" in result:
            ratio = result["ratio_hpcring_over_ddp"]
            print(
                f"hpcring/DDP ratio: median {ratio['median']} (quartiles {ratio['p25']}..{ratio['p75']})  "
                f"max weight difference {result['max_weight_difference']:.2e}",
                flush=True,
            )
        if "ratio_adasum_over_average" in result:
            ada = result["ratio_adasum_over_average"]
            print(f"Adasum/Average ratio: median {ada['median']} (quartiles {ada['p25']}..{ada['p75']})")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
