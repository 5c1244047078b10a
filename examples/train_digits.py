"""Data-parallel training of a small MLP on scikit-learn's handwritten digits, the Horovod way.

Run it on one process or many, unchanged:

    hpcring run -np 4 -- python examples/train_digits.py --epochs 12

The script is a plain Horovod PyTorch script with one changed import (`hpcring.torch` for `horovod.torch`):
each rank reads its own shard (DistributedSampler), the learning rate is scaled by the number of ranks (the
global batch grows with it), rank 0's initial weights and optimizer state are broadcast so every rank starts
alike, DistributedOptimizer averages gradients, metrics are averaged with allreduce, and only rank 0 writes
the checkpoint and the metrics file (each written to a temporary name, then renamed, so a reader never sees
half a file). The digits set ships inside scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpcring.torch as hvd


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12, help="passes over the training set (default 12)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank; scaled by size")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights, the split and the shuffling")
    p.add_argument("--checkpoint", type=Path, help="rank 0 saves model and optimizer state here each epoch")
    p.add_argument("--json-metrics", type=Path, help="rank 0 writes the final metrics here as JSON")
    return p.parse_args(argv)


def datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """80/20 split of the 1797 8x8 digits, pixels scaled to [0, 1]; identical on every rank (fixed seed)."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        range(len(y)), test_size=0.2, random_state=seed, stratify=digits.target
    )
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def atomic_write(path: Path, write: Any) -> None:
    """Write via `write(tmp_path)`, then rename over `path`: readers see the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def save_checkpoint(path: Path, epoch: int, model: torch.nn.Module, opt: Any) -> None:
    state = {"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def metric_average(value: float, name: str) -> float:
    """Mean of a scalar over all ranks."""
    return float(hvd.allreduce(torch.tensor(value), name=name, op=hvd.Average))


def train_epoch(
    model: torch.nn.Module, loader: DataLoader[Any], sampler: DistributedSampler[Any], opt: Any, epoch: int
) -> float:
    model.train()
    sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
    total, batches = 0.0, 0
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total, batches = total + loss.item(), batches + 1
    return metric_average(total / max(batches, 1), "train_loss")


def evaluate(model: torch.nn.Module, loader: DataLoader[Any]) -> tuple[float, float]:
    """Accuracy and loss over the whole test set: each rank scores its shard, the counts are summed."""
    model.eval()
    correct = loss = count = 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += float((out.argmax(1) == y).sum())
            count += len(y)
    sums = hvd.allreduce(torch.tensor([correct, loss, count], dtype=torch.float64), name="eval", op=hvd.Sum)
    return float(sums[0] / sums[2]), float(sums[1] / sums[2])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one thread per rank: ranks already share the cores
    hvd.init()
    torch.manual_seed(args.seed)
    train_set, test_set = datasets(args.seed)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    # Cosine decay to zero: large scaled steps early, a settled model at the end (schedulers see a plain SGD).
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.epochs, 1))

    start = time.perf_counter()
    train_loss = accuracy = test_loss = float("nan")
    samples = len(train_set)  # every epoch trains on the whole set, split over the ranks
    for epoch in range(args.epochs):
        began = time.perf_counter()
        train_loss = train_epoch(model, train_loader, train_sampler, opt, epoch)
        scheduler.step()
        took = time.perf_counter() - began
        accuracy, test_loss = evaluate(model, test_loader)
        if hvd.rank() == 0:
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  train loss {train_loss:.4f}  "
                f"test loss {test_loss:.4f}  test accuracy {accuracy:.4f}  {took:.2f} s  "
                f"{samples / took:,.0f} samples/s",
                flush=True,
            )
            if args.checkpoint:
                save_checkpoint(args.checkpoint, epoch + 1, model, opt)
    seconds = time.perf_counter() - start
    if hvd.rank() == 0:
        rate = samples * args.epochs / seconds if seconds > 0 else float("nan")
        print(
            f"done: {args.epochs} epochs on {hvd.size()} ranks in {seconds:.1f} s, {rate:,.0f} samples/s, "
            f"final accuracy {accuracy:.4f} on the test set",
            flush=True,
        )
    if hvd.rank() == 0 and args.json_metrics:
        metrics = {
            "test_accuracy": accuracy,
            "test_loss": test_loss,
            "train_loss": train_loss,
            "epochs": args.epochs,
            "size": hvd.size(),
            "batch_size_per_rank": args.batch_size,
            "lr": args.lr * hvd.size(),
            "train_seconds": round(seconds, 3),
        }
        atomic_write(args.json_metrics, lambda tmp: tmp.write_text(json.dumps(metrics, indent=2) + "\n"))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
