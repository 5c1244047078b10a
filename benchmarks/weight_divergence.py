"""How far two correct data-parallel runs of one model drift apart when they only round differently.

    python benchmarks/weight_divergence.py --model mlp200
    python benchmarks/weight_divergence.py --model mlp --steps 150

`bench_ddp.py` ends by comparing hpcring's weights with DDP's. Both compute the same synchronous SGD, but a
sum over 4 ranks may be added in another order (hpcring's shared memory adds in rank order, gloo's ring in
its own), and fp16 compression rounds in another place (hpcring sums the fp16 gradients and divides after
the cast back; DDP's `fp16_compress_hook` divides in fp16 first). This runs the ranks inside one process, on
the batches `bench_ddp.py` gives them, and prints, at a few steps, the largest weight difference between two
runs that differ only in that way:

- `order`: 4 ranks, float32, ((a + b) + c) + d against (a + b) + (c + d);
- `fp16`: 2 ranks, hpcring's fp16 average against DDP's hook, each also against the float32 average;
- `fp16 one step`: the error of each fp16 average against the float32 one on the first step's gradients.

A deep ReLU network amplifies a one-ulp difference step after step (the 100-layer `mlp200`); a shallow one
(`mlp`) does not, so the same comparison there stays near float rounding.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_models  # benchmarks/ is not a package: its directory is put on the path above

Average = Callable[[list[torch.Tensor]], torch.Tensor]

AVERAGES: dict[str, Average] = {
    "rank order": lambda g: (((g[0] + g[1]) + g[2]) + g[3]) / 4,
    "pairs": lambda g: ((g[0] + g[1]) + (g[2] + g[3])) / 4,
    "float32": lambda g: (g[0] + g[1]) / 2,
    "hpcring fp16": lambda g: (g[0].half() + g[1].half()).float() * 0.5,
    "DDP fp16 hook": lambda g: (g[0].half() / 2 + g[1].half() / 2).float(),
}


def rank_gradients(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    model.zero_grad()
    x, y = batch
    F.cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def train(name: str, ranks: int, averages: list[str], steps: int, report: set[int]) -> None:
    """One model per averaging rule, the same seeded weights and per-rank batches; prints the differences
    of every rule to the first one at the steps in `report`."""
    models = {a: ddp_models.build(name) for a in averages}
    opts = {a: torch.optim.SGD(m.parameters(), lr=0.01) for a, m in models.items()}
    gens = [torch.Generator().manual_seed(1000 + r) for r in range(ranks)]  # bench_ddp.py's seeds
    for step in range(1, steps + 1):
        batches = [ddp_models.batch(name, 64, g) for g in gens]
        for a, model in models.items():
            per_rank = [rank_gradients(model, b) for b in batches]
            for p, grads in zip(model.parameters(), zip(*per_rank, strict=True), strict=True):
                p.grad = AVERAGES[a](list(grads))
            opts[a].step()
        if step in report:
            first = averages[0]
            diffs = ", ".join(f"{a} {max_difference(models[a], models[first]):.2e}" for a in averages[1:])
            print(
                f"{name}, {ranks} ranks, step {step}: max weight difference to {first}: {diffs}", flush=True
            )


def one_step_error(name: str) -> None:
    """Error of each fp16 average against the float32 one, on the first step's gradients of 2 ranks."""
    model = ddp_models.build(name)
    gens = [torch.Generator().manual_seed(1000 + r) for r in range(2)]
    flat = [
        torch.cat([g.flatten() for g in rank_gradients(model, ddp_models.batch(name, 64, gen))])
        for gen in gens
    ]
    exact = AVERAGES["float32"](flat)
    for a in ("hpcring fp16", "DDP fp16 hook"):
        got = AVERAGES[a](flat)
        lost = int(((got == 0) & (exact != 0)).sum())
        print(
            f"{name}, fp16 one step, {a}: sum |error| {float((got - exact).abs().sum()):.4e}, "
            f"max |error| {float((got - exact).abs().max()):.3e}, non-zero gradients flushed to 0: {lost}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(ddp_models.MODELS), default="mlp200")
    p.add_argument("--steps", type=int, default=150)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    report = {s for s in (1, 10, 50, args.steps) if s <= args.steps}
    train(args.model, 4, ["rank order", "pairs"], args.steps, report)
    train(args.model, 2, ["float32", "hpcring fp16", "DDP fp16 hook"], args.steps, report)
    one_step_error(args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
