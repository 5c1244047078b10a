"""The engine's device data plane against torch.distributed's own allreduce, on the same ranks and tensors.

Run under the launcher (benchmarks/gpu_check.sh runs the CUDA form on a GPU node):

    hpcring run -np 2 -- python benchmarks/bench_device_plane.py --device cuda --size 64M
    hpcring run -np 2 -- python benchmarks/bench_device_plane.py --device cpu --size 64M   # gloo, CI

Rows (each an in-place float32 SUM allreduce of `--size` bytes, median over `--repeats` of the slowest
rank's time, the rows interleaved per repetition so drifting load hits them alike):

- `engine (device plane)`: `hvd.allreduce_` of the tensor: negotiation, then the device plane (NCCL on
  CUDA; gloo for CPU tensors, with HPCRING_CPU_DEVICE_PLANE=gloo, which this script sets);
- `torch.distributed.all_reduce`: the default process group (NCCL on CUDA, gloo on CPU) called directly;
- on CPU also `engine (host path)`: the same engine with the device plane off (numpy + MPI), for reference.

CUDA timing: every measured call is bracketed by `torch.cuda.synchronize()`, so a row is the time until the
GPU has the result, not until the call was queued. Each rank uses one GPU: cuda:LOCAL_RANK, or cuda:(RANK mod
the GPU count) when nodes are emulated on one machine (`--emulate-nodes`), so ranks never share a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

from hpcring.config import parse_bytes


def rank_device(kind: str) -> torch.device:
    """This rank's device: a GPU of its own on CUDA."""
    if kind == "cpu":
        return torch.device("cpu")
    if os.environ.get("HPCRING_EMULATE_NODES"):
        index = int(os.environ.get("RANK", "0")) % torch.cuda.device_count()
    else:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def init_torch_distributed(comm: Any, backend: str) -> None:
    """The default process group, with the store address agreed over MPI (no MASTER_ADDR needed)."""
    from hpcring.collective.backends.nccl import _rendezvous

    store = _rendezvous(comm)
    dist.init_process_group(backend, store=store, rank=comm.Get_rank(), world_size=comm.Get_size())


def measure(comm: Any, device: torch.device, fn: Callable[[], None]) -> float:
    """One timed call, as the slowest rank saw it (ranks lined up by a barrier first)."""
    sync(device)
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    sync(device)
    elapsed = time.perf_counter() - t0
    slowest: float = comm.allreduce(elapsed, op=MPI.MAX)
    return slowest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size", default="64M", help="bytes per allreduce (e.g. 64M)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file (rank 0)")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["HPCRING_CPU_DEVICE_PLANE"] = "gloo"
    torch.set_num_threads(1)
    import hpcring.torch as hvd

    device = rank_device(args.device)
    comm = MPI.COMM_WORLD.Dup()
    count = parse_bytes("--size", args.size) // 4
    hvd.init()
    init_torch_distributed(comm, "nccl" if args.device == "cuda" else "gloo")
    t = torch.ones(count, dtype=torch.float32, device=device)

    def engine() -> None:
        hvd.allreduce_(t, op=hvd.Sum, name="bench.device_plane")

    def direct() -> None:
        dist.all_reduce(t)

    times = run_rows(
        comm, device, t, args, {"engine (device plane)": engine, "torch.distributed.all_reduce": direct}
    )
    if args.device == "cpu":  # the same engine on the host path (numpy + MPI), after a re-init
        hvd.shutdown()
        os.environ["HPCRING_CPU_DEVICE_PLANE"] = "off"
        hvd.init()
        times.update(run_rows(comm, device, t, args, {"engine (host path, MPI)": engine}))
    report(comm, args, times)
    hvd.shutdown()
    dist.destroy_process_group()


def run_rows(
    comm: Any,
    device: torch.device,
    t: torch.Tensor,
    args: argparse.Namespace,
    rows: dict[str, Callable[[], None]],
) -> dict[str, list[float]]:
    """Time every row `args.repeats` times (after `args.warmup` untimed rounds), interleaved per repetition;
    each call reduces ones, and the result is checked."""
    times: dict[str, list[float]] = {name: [] for name in rows}
    for i in range(args.warmup + args.repeats):
        for name, fn in rows.items():
            t.fill_(1.0)
            dt = measure(comm, device, fn)
            if float(t[0]) != comm.Get_size():
                raise SystemExit(f"{name}: wrong result {float(t[0])}, expected {comm.Get_size()}")
            if i >= args.warmup:
                times[name].append(dt)
    return times


def report(comm: Any, args: argparse.Namespace, times: dict[str, list[float]]) -> None:
    """Rank 0 prints medians and the ratio to torch.distributed's own call."""
    if comm.Get_rank() != 0:
        return
    peer = statistics.median(times["torch.distributed.all_reduce"])
    print(
        f"allreduce of {args.size} float32 on {args.device}, {comm.Get_size()} ranks, "
        f"median of {args.repeats} (slowest rank per repetition)"
    )
    figures = {}
    for name, values in times.items():
        med = statistics.median(values)
        figures[name] = {"median_s": med, "ratio_to_torch_distributed": med / peer}
        print(f"  {name:<32} {med * 1e3:9.2f} ms   x{med / peer:5.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"size": args.size, "device": args.device, "ranks": comm.Get_size(), **figures}, f, indent=1
            )


if __name__ == "__main__":
    main()
