"""A training step through DistributedOptimizer on the GPU: against the same model with no communication, and
against DDP, with a trace of when the communication stream works while backward still runs.

    hpcring run -np 1 -- python benchmarks/bench_gpu_step.py --models mlp,mlp200,transformer --ddp nccl
    HPCRING_ALLREDUCE_ALGORITHM=hierarchical hpcring run -np 2 --emulate-nodes 2 -- \\
        python benchmarks/bench_gpu_step.py --models resnet,transformer --trace overlap.json
    hpcring run -np 2 -- python benchmarks/bench_gpu_step.py --device cpu --models resnet   # dry run, CI

Per model, the trainers step in turn (the order alternating), each step timed until the GPU is done and the
slowest rank has finished: `compute-only` (the model and optimizer alone), `hpcring` (DistributedOptimizer,
the route the environment chooses) and, with `--ddp`, DDP over that backend (NCCL needs a GPU per rank).
Rows: median step times and the ratios to compute-only and to DDP.

Overlap (CUDA): for `--trace-steps` steps of hpcring the device plane records a pair of timing events around
each batch on its communication stream, and the step records events around backward on the training stream.
`hidden` is the share of communication time that lay inside backward; `--trace` writes the intervals as a
Chrome trace (rows: backward, each lane) to look at in Perfetto. One rank's view (rank 0).

At one rank DistributedOptimizer has nothing to reduce and skips reduction, while DDP still runs its NCCL
allreduce: the comparison with DDP then measures what each adds to a step, not what scales.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_models
from bench_device_plane import rank_device

import hpcring.torch as hvd
from hpcring.torch import basics


class Trainer:
    """A model, its optimizer and its own batch stream on `device`; `step()` runs one training step."""

    def __init__(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        kind: str,
        batch: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.model, self.opt, self.kind, self.batch, self.device = model, opt, kind, batch, device
        self.gen = torch.Generator().manual_seed(seed)
        self.marks: list[tuple[Any, Any]] | None = None  # (backward start, end) events while tracing

    def step(self) -> None:
        x, y = ddp_models.batch(self.kind, self.batch, self.gen)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        start = _event(self.device) if self.marks is not None else None
        loss.backward()
        if start is not None and self.marks is not None:
            self.marks.append((start, _event(self.device)))
        self.opt.step()


def _event(device: torch.device) -> Any:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def build(kind: str, device: torch.device, batch: int, ddp: str | None) -> dict[str, Trainer]:
    """compute-only, hpcring and (with `ddp`) DDP trainers with the same weights and the same batches."""
    seed = 1000 + hvd.rank()
    out: dict[str, Trainer] = {}
    local = ddp_models.build(kind).to(device)
    out["compute-only"] = Trainer(
        local, torch.optim.SGD(local.parameters(), lr=0.01), kind, batch, seed, device
    )
    ours = ddp_models.build(kind).to(device)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=0.01), named_parameters=ours.named_parameters()
    )
    out["hpcring"] = Trainer(ours, opt, kind, batch, seed, device)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(
            ddp_models.build(kind).to(device), device_ids=ids, broadcast_buffers=False
        )
        out["ddp"] = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), kind, batch, seed, device)
    return out


def timed(comm: Any, device: torch.device, step: Callable[[], None]) -> float:
    """One step until the GPU is done, as the slowest rank saw it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    comm.Barrier()
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    slowest: float = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return slowest


def overlap(trainer: Trainer, steps: int, comm: Any, device: torch.device) -> dict[str, Any] | None:
    """Trace `steps` steps: the share of communication-stream time that lay inside backward, and the
    intervals (ms from each step's backward start) for the Chrome trace."""
    plane = basics.engine().device_plane
    if device.type != "cuda" or plane is None:
        return None
    trainer.marks, plane.trace = [], []
    comm_ms = hidden_ms = 0.0
    spans: list[dict[str, Any]] = []
    for s in range(steps):
        plane.trace.clear()
        trainer.marks.clear()
        timed(comm, device, trainer.step)
        (b0, b1), batches = trainer.marks[0], list(plane.trace)
        end = b0.elapsed_time(b1)
        spans.append({"step": s, "lane": "backward", "begin_ms": 0.0, "end_ms": end})
        for start, done, names in batches:
            lo, hi = b0.elapsed_time(start), b0.elapsed_time(done)
            comm_ms += hi - lo
            hidden_ms += max(0.0, min(hi, end) - max(lo, 0.0))
            spans.append(
                {"step": s, "lane": "communication", "begin_ms": lo, "end_ms": hi, "tensors": len(names)}
            )
    trainer.marks, plane.trace = None, None
    share = hidden_ms / comm_ms if comm_ms else 0.0
    return {"communication_ms_per_step": comm_ms / steps, "hidden_share": round(share, 3), "spans": spans}


def chrome_trace(per_model: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The traced intervals as Chrome trace events: one process per model, a row each for backward and
    communication, steps laid side by side 1.5x the longest step apart."""
    events: list[dict[str, Any]] = []
    for pid, (model, found) in enumerate(per_model.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": model}})
        spans = found["spans"]
        width = 1.5 * max(x["end_ms"] for x in spans) if spans else 0.0
        for x in spans:
            tid = 0 if x["lane"] == "backward" else 1
            ts = (x["step"] * width + x["begin_ms"]) * 1e3
            dur = (x["end_ms"] - x["begin_ms"]) * 1e3
            events.append({"name": x["lane"], "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur})
    return events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--models", default="resnet,transformer")
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trace-steps", type=int, default=5)
    ap.add_argument("--ddp", choices=("nccl", "gloo"), default=None, help="also time DDP over this backend")
    ap.add_argument("--trace", type=Path, default=None, help="rank 0 writes the overlap as a Chrome trace")
    ap.add_argument("--json", type=Path, default=None, help="rank 0 writes the figures here")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("HPCRING_CPU_DEVICE_PLANE", "gloo")
        torch.set_num_threads(1)
    device = rank_device(args.device)
    comm = MPI.COMM_WORLD.Dup()
    hvd.init()
    if args.ddp:
        from hpcring.collective.backends.nccl import _rendezvous

        dist.init_process_group(
            args.ddp, store=_rendezvous(comm), rank=comm.Get_rank(), world_size=comm.Get_size()
        )
    results: dict[str, Any] = {}
    traces: dict[str, dict[str, Any]] = {}
    for kind in args.models.split(","):
        trainers = build(kind, device, args.batch, args.ddp)
        for t in trainers.values():
            for _ in range(args.warmup):
                timed(comm, device, t.step)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        names = list(trainers)
        for i in range(args.steps):
            for name in names if i % 2 == 0 else reversed(names):
                times[name].append(timed(comm, device, trainers[name].step))
        med = {k: statistics.median(v) for k, v in times.items()}
        row: dict[str, Any] = {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "hpcring_over_compute_only": round(med["hpcring"] / med["compute-only"], 3),
        }
        if "ddp" in med:
            row["hpcring_over_ddp"] = round(med["hpcring"] / med["ddp"], 3)
        found = overlap(trainers["hpcring"], args.trace_steps, comm, device)
        if found is not None:
            row["communication_ms_per_step"] = round(found["communication_ms_per_step"], 3)
            row["hidden_share"] = found["hidden_share"]
            traces[kind] = found
        results[kind] = row
    if comm.Get_rank() == 0:
        route = (
            os.environ.get("HOROVOD_GPU_OPERATIONS") or os.environ.get("HPCRING_CPU_DEVICE_PLANE") or "nccl"
        )
        meta = {"device": str(device), "ranks": comm.Get_size(), "route": route}
        meta["algorithm"] = os.environ.get("HPCRING_ALLREDUCE_ALGORITHM", "auto")
        print(json.dumps({**meta, "models": results}, indent=1))
        if comm.Get_size() == 1:
            print("note: at 1 rank DistributedOptimizer skips reduction and DDP does not (see the docstring)")
        if args.json:
            args.json.write_text(json.dumps({**meta, "models": results}, indent=1))
        if args.trace and traces:
            args.trace.write_text(json.dumps(chrome_trace(traces)))
    hvd.shutdown()
    if args.ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
