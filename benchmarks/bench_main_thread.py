"""The training thread's progress while the engine cycles: issue 37's "a Python loop loses <= 5 %" figure.

    hpcring run -np 2 -- python benchmarks/bench_main_thread.py --json main_thread.json   # and -np 1

The "training thread" is the main thread running a pure-Python loop for `--window` seconds: each iteration a
fixed unit of integer arithmetic (`--work` steps) and one clock read; the figure is its iterations per second.
Every `1 / --rate` seconds of the loop's clock a tick is due, and each window runs one of three modes:

- `idle`: the tick does nothing; `hpcring.torch` is initialised, its engine thread idle (the baseline);
- `training`: the loop itself issues the op, as a training step does: it synchronizes the handle it
  submitted `--depth` ticks ago (normally done by then) and submits `hvd.allreduce_async_` of a `--bytes`
  float32 tensor, so the engine negotiates and moves it while the loop goes on computing;
- `thread`: a second Python thread issues the same ops at the same rate (sleeping to each tick), and the
  main loop only computes: the engine's and the issuer's contention for the GIL and the cores, apart.

Losses, per rank, for each round's loaded window against that round's `idle` window, medians over `--rounds`
rounds (the three modes alternate, their order rotating each round):

- `loss_training_raw` = 1 - training iterations/s / idle iterations/s;
- `loss_training_excl` = the same with the loop's own time inside the hpcring submit/poll/synchronize calls
  taken out of the window (iterations / (window - own call time)): what the engine costs the loop while it
  runs beside it, not what the calls themselves cost (`own_call_us_per_op`);
- `loss_thread` = 1 - thread-mode iterations/s / idle iterations/s.

Also per rank: the achieved op rate, the share of synchronizes that found the op still pending, the ops per
engine cycle (`ops_per_cycle`: 1 when each op has its own cycle, 2 when they go in pairs), and the CPU
time of the engine thread (the thread named `hpcring-engine`, read from /proc/self/task/TID/schedstat) and of
the main thread per wall second. `worst` is the slowest rank's (largest) loss. Every rank issues the same
number of ops per window, `--rate` x `--window`: the ticks its clock did not reach inside the window are
issued after it, before every handle is synchronized. (Agreeing on the counts after the window deadlocked
now and then: a rank whose clock issued more waited, inside the window, for an op of a peer that the peer
would issue only after the agreement.) `core` says which engine core ran:
`hpcring.engine.core.kind()`, "compiled" or "python" (HPCRING_PURE_PYTHON=1 forces the Python twin).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from mpi4py import MPI

import hpcring.torch as hvd
from hpcring.torch import basics

MODES = ("idle", "training", "thread")
ENGINE_THREAD = "hpcring-engine"
LOSSES = ("loss_training_raw", "loss_training_excl", "loss_thread")


def work(steps: int) -> int:
    """One unit of the training thread's pure-Python computation (a linear congruential walk)."""
    acc = 1
    for k in range(steps):
        acc = (acc * 1103515245 + k) & 0x7FFFFFFF
    return acc


def core_kind() -> str:
    """The request path's core in use: "compiled" or "python" (hpcring/engine/core/__init__.py)."""
    from hpcring.engine import core

    return core.kind()


def engine_tid() -> int | None:
    """The engine thread's kernel id: a Python thread by that name, else an OS thread whose comm says so
    (a compiled core may start its own)."""
    for t in threading.enumerate():
        if t.name == ENGINE_THREAD and t.native_id is not None:
            return t.native_id
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == ENGINE_THREAD:
                return int(task.name)
        except OSError:
            continue
    return None


def thread_cpu_s(tid: int | None) -> float | None:
    """CPU seconds a thread of this process has run (schedstat: ns; else stat's utime + stime ticks)."""
    if tid is None:
        return None
    base = Path(f"/proc/self/task/{tid}")
    try:
        return int((base / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Issuer:
    """Issues the window's ops: each `op()` synchronizes the handle `depth` ops back and submits one more."""

    def __init__(self, nbytes: int, depth: int) -> None:
        self.depth = depth
        self.tensors = [torch.zeros(max(1, nbytes // 4)) for _ in range(depth)]  # zeros: sums stay finite
        self.handles: collections.deque[int] = collections.deque()
        self.count = 0
        self.pending_at_sync = 0
        self.syncs = 0
        self.sync_s = 0.0  # time inside poll + synchronize (the rest of an op's call time is the submit)

    def op(self) -> None:
        if len(self.handles) >= self.depth:
            t0 = time.perf_counter()
            self._sync_oldest()
            self.sync_s += time.perf_counter() - t0
        slot = self.count % self.depth  # the slot's previous op was synchronized just above
        self.handles.append(hvd.allreduce_async_(self.tensors[slot], op=hvd.Sum, name=f"mt.{slot}"))
        self.count += 1

    def _sync_oldest(self) -> None:
        h = self.handles.popleft()
        self.syncs += 1
        if not hvd.poll(h):
            self.pending_at_sync += 1
        hvd.synchronize(h)

    def finish(self, target: int) -> None:
        """Outside the window: issue up to the count every rank agreed on, then synchronize everything."""
        while self.count < target:
            self.op()
        while self.handles:
            hvd.synchronize(self.handles.popleft())


def issue_thread(issuer: Issuer, period: float, t0: float, stop: threading.Event, target: int) -> None:
    """The `thread` mode's issuer: one op per tick of the same clock as the loop's, sleeping in between, up
    to the window's `target` ops."""
    due = t0 + period
    while not stop.is_set() and issuer.count < target:
        now = time.perf_counter()
        if now >= due:
            due += period
            issuer.op()
        else:
            time.sleep(due - now)


def training_loop(
    args: argparse.Namespace, issuer: Issuer | None, t0: float, target: int
) -> tuple[int, float, float]:
    """The training thread's loop from `t0` for the window: (iterations, seconds inside hpcring calls,
    elapsed seconds). Every mode takes the tick branch; only with an `issuer` does it call hpcring (up to the
    window's `target` ops)."""
    period, steps, own = 1.0 / args.rate, args.work, 0.0
    end, due, iters = t0 + args.window, t0 + period, 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now >= due:
            due += period
            if issuer is not None and issuer.count < target:
                issuer.op()
                own += time.perf_counter() - now
        work(steps)
        iters += 1
    return iters, own, time.perf_counter() - t0


def run_window(comm: Any, mode: str, args: argparse.Namespace, tid: int | None) -> dict[str, float]:
    """One window of the loop in `mode`; its figures on this rank."""
    issuer = Issuer(args.bytes, args.depth)
    target = round(args.rate * args.window)  # the same on every rank: no agreement after the window
    stop = threading.Event()
    comm.Barrier()
    stats = basics.engine().stats
    cycles0 = stats["cycles"]
    cpu0, main0 = thread_cpu_s(tid), time.thread_time()
    t0 = time.perf_counter()
    helper = None
    if mode == "thread":
        helper = threading.Thread(
            target=issue_thread, args=(issuer, 1.0 / args.rate, t0, stop, target), daemon=True
        )
        helper.start()
    iters, own, elapsed = training_loop(args, issuer if mode == "training" else None, t0, target)
    cpu1, main1 = thread_cpu_s(tid), time.thread_time()
    stop.set()
    if helper is not None:
        helper.join()
    cycles = stats["cycles"] - cycles0
    ops, sync_s, syncs, pending = issuer.count, issuer.sync_s, issuer.syncs, issuer.pending_at_sync
    issuer.finish(target)  # outside the window: not in its figures
    return {
        "ips": iters / elapsed,
        "ips_excl": iters / (elapsed - own),
        "ops_per_s": ops / elapsed,
        "own_share": own / elapsed,
        "own_us_per_op": 1e6 * own / ops if ops else 0.0,
        "sync_us_per_op": 1e6 * sync_s / ops if ops else 0.0,
        "pending_at_sync": pending / syncs if syncs else 0.0,
        "ops_per_cycle": ops / cycles if cycles else 0.0,
        "engine_cpu_share": (cpu1 - cpu0) / elapsed if cpu0 is not None and cpu1 is not None else -1.0,
        "main_cpu_share": (main1 - main0) / elapsed,
    }


def _med(values: list[float], digits: int = 4) -> float:
    return round(statistics.median(values), digits)


def losses(loaded: list[dict[str, float]], idle: list[dict[str, float]], key: str) -> list[float]:
    """Per round: 1 - the loaded window's `key` iterations/s over the same round's idle window's."""
    return [round(1 - w[key] / i["ips"], 4) for w, i in zip(loaded, idle, strict=True)]


def summarise(windows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """This rank's medians over the rounds; losses paired with the same round's idle window."""
    idle, train = windows["idle"], windows["training"]
    rounds = {
        "training_raw": losses(train, idle, "ips"),
        "training_excl": losses(train, idle, "ips_excl"),
        "thread": losses(windows["thread"], idle, "ips"),
    }
    return {
        "ips": {m: round(statistics.median(w["ips"] for w in windows[m])) for m in MODES},
        "ips_training_excl": round(statistics.median(w["ips_excl"] for w in train)),
        **{f"loss_{k}": _med(v) for k, v in rounds.items()},
        "loss_rounds": rounds,
        "ops_per_s": {m: _med([w["ops_per_s"] for w in windows[m]], 1) for m in MODES[1:]},
        "own_call_share": _med([w["own_share"] for w in train], 3),
        "own_call_us_per_op": _med([w["own_us_per_op"] for w in train], 2),
        "own_sync_us_per_op": _med([w["sync_us_per_op"] for w in train], 2),
        "pending_at_sync": {m: _med([w["pending_at_sync"] for w in windows[m]], 3) for m in MODES[1:]},
        "ops_per_cycle": {m: _med([w["ops_per_cycle"] for w in windows[m]], 3) for m in MODES[1:]},
        "engine_cpu_share": {m: _med([w["engine_cpu_share"] for w in windows[m]], 3) for m in MODES},
        "main_cpu_share": {m: _med([w["main_cpu_share"] for w in windows[m]], 3) for m in MODES},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=float, default=2.0, help="seconds per window")
    p.add_argument("--rounds", type=int, default=5, help="windows of each mode (medians over these)")
    p.add_argument("--rate", type=float, default=1000.0, help="ops per second in the loaded windows")
    p.add_argument("--bytes", type=int, default=4096, help="bytes of float32 per op")
    p.add_argument("--depth", type=int, default=2, help="ops in flight: synchronize the one this far back")
    p.add_argument("--work", type=int, default=100, help="arithmetic steps per loop iteration")
    p.add_argument(
        "--switch-interval", type=float, default=None, help="ms: sys.setswitchinterval (default: Python's)"
    )
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the result here")
    args = p.parse_args(argv)
    for field in ("window", "rounds", "rate", "bytes", "depth", "work", "switch_interval"):
        value = getattr(args, field)
        if value is not None and value <= 0:
            p.error(f"--{field.replace('_', '-')} must be > 0, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1000.0)
    hvd.init()
    comm = MPI.COMM_WORLD
    load_before = os.getloadavg()
    tid = engine_tid()
    warm = argparse.Namespace(**{**vars(args), "window": min(0.3, args.window)})
    for mode in MODES:  # warm-up: the response cache, the threads, the allocator
        run_window(comm, mode, warm, tid)
    windows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 3 :] + MODES[: r % 3]:
            windows[mode].append(run_window(comm, mode, args, tid))
    ranks = comm.gather(summarise(windows), root=0)
    if hvd.rank() == 0:
        result = {
            "size": hvd.size(),
            "core": core_kind(),
            "pure_python_env": os.environ.get("HPCRING_PURE_PYTHON", ""),
            "settings": {k: v for k, v in vars(args).items() if k != "json"},
            "switch_interval_ms": round(1000 * sys.getswitchinterval(), 3),
            "engine_thread_found": tid is not None,
            "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "worst": {k: max(r[k] for r in ranks) for k in LOSSES},
            "ranks": ranks,
        }
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
