"""The engine's device data plane against torch.distributed's own allreduce, on the same ranks and tensors.

Run under the launcher (benchmarks/gpu_check.sh runs the CUDA forms on a GPU machine):

    hpcring run -np 1 -- python benchmarks/bench_device_plane.py --device cuda --sizes 4,1M,64M
    HOROVOD_GPU_OPERATIONS=MPI hpcring run -np 2 -- \\
        python benchmarks/bench_device_plane.py --device cuda --sizes 4,1M,64M --peer gloo
    hpcring run -np 2 -- python benchmarks/bench_device_plane.py --device cpu --sizes 64M   # CI: gloo

Rows, per size (an in-place float32 SUM allreduce of that many bytes, median over `--repeats` of the slowest
rank's time, the rows interleaved per repetition so drifting load hits them alike):

- `engine`: `hvd.allreduce_` of the tensor, a synchronous op: negotiation, then the device plane on the route
  the environment chooses (NCCL, or the MPI route under HOROVOD_GPU_OPERATIONS=MPI; gloo or the MPI stand-in
  for CPU tensors under HPCRING_CPU_DEVICE_PLANE, which `--device cpu` sets to gloo unless given);
- `torch.distributed.all_reduce`: the default process group (`--peer`: NCCL, or gloo, which also takes CUDA
  tensors, staging them on the host as the MPI route does) called directly on the same tensor;
- on CPU also `engine (host path)`: the same engine with the device plane off (numpy + MPI), for reference.

CUDA timing: every measured call is followed by `torch.cuda.synchronize()`, so a row is the time until the
GPU has the result. Each rank uses cuda:(LOCAL_RANK, or RANK under emulated nodes, modulo the GPU count):
with fewer GPUs than ranks, ranks share one (the MPI route allows it; NCCL does not).
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
    """This rank's device: a GPU of its own where there are enough, else shared round-robin."""
    if kind == "cpu":
        return torch.device("cpu")
    key = "RANK" if os.environ.get("HPCRING_EMULATE_NODES") else "LOCAL_RANK"
    index = int(os.environ.get(key, "0")) % torch.cuda.device_count()
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
    ap.add_argument("--sizes", default="64M", help="comma-separated bytes per allreduce (e.g. 4,1M,64M)")
    ap.add_argument(
        "--peer", choices=("nccl", "gloo"), default=None, help="default: nccl on CUDA, gloo on CPU"
    )
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file (rank 0)")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("HPCRING_CPU_DEVICE_PLANE", "gloo")
    peer = args.peer or ("nccl" if args.device == "cuda" else "gloo")
    torch.set_num_threads(1)
    import hpcring.torch as hvd

    device = rank_device(args.device)
    comm = MPI.COMM_WORLD.Dup()
    hvd.init()
    init_torch_distributed(comm, peer)
    figures: dict[str, Any] = {}
    for size in args.sizes.split(","):
        t = torch.ones(max(1, parse_bytes("--sizes", size) // 4), dtype=torch.float32, device=device)

        def engine(t: torch.Tensor = t) -> None:
            hvd.allreduce_(t, op=hvd.Sum, name="bench.device_plane")

        def direct(t: torch.Tensor = t) -> None:
            dist.all_reduce(t)

        rows = {"engine": engine, f"torch.distributed.all_reduce ({peer})": direct}
        times = run_rows(comm, device, t, args, rows)
        if args.device == "cpu":  # the same engine on the host path (numpy + MPI), after a re-init
            hvd.shutdown()
            plane = os.environ["HPCRING_CPU_DEVICE_PLANE"]
            os.environ["HPCRING_CPU_DEVICE_PLANE"] = "off"
            hvd.init()
            times.update(run_rows(comm, device, t, args, {"engine (host path, MPI)": engine}))
            hvd.shutdown()
            os.environ["HPCRING_CPU_DEVICE_PLANE"] = plane
            hvd.init()
        figures[size] = report(comm, args, size, peer, times)
    if comm.Get_rank() == 0 and args.json:
        route = (
            os.environ.get("HOROVOD_GPU_OPERATIONS") or os.environ.get("HPCRING_CPU_DEVICE_PLANE") or "nccl"
        )
        with open(args.json, "w", encoding="utf-8") as f:
            meta = {"device": args.device, "ranks": comm.Get_size(), "route": route, "peer": peer}
            json.dump({**meta, "sizes": figures}, f, indent=1)
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


def report(
    comm: Any, args: argparse.Namespace, size: str, peer: str, times: dict[str, list[float]]
) -> dict[str, Any]:
    """Rank 0 prints medians and the ratio to torch.distributed's own call; returns them."""
    base = statistics.median(times[f"torch.distributed.all_reduce ({peer})"])
    out = {}
    for name, values in times.items():
        med = statistics.median(values)
        out[name] = {"median_us": round(med * 1e6, 1), "ratio_to_torch_distributed": round(med / base, 2)}
    if comm.Get_rank() == 0:
        print(
            f"allreduce of {size} B float32 on {args.device}, {comm.Get_size()} ranks, "
            f"median of {args.repeats} (slowest rank per repetition)"
        )
        for name, row in out.items():
            print(f"  {name:<36} {row['median_us']:11.1f} us   x{row['ratio_to_torch_distributed']:5.2f}")
    return out


if __name__ == "__main__":
    main()
