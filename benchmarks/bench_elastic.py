"""Elastic training costs: commit() against an in-memory copy, step time with elastic on and off, and
recovery after a rank is killed.

    hpcring run -np 1 -- python benchmarks/bench_elastic.py commit [--mb 100]
    hpcring run -H 127.0.0.1:2 --min-np 2 -- python benchmarks/bench_elastic.py steps
    python benchmarks/bench_elastic.py recovery --np 3 [--repeat 3]

`commit`: a TorchState of a model whose parameters weigh --mb MB. Alternating rounds time (a) a plain
in-memory copy of the same tensors (`clone()` of each, into new memory), (a') the same copy into buffers kept
from the last round (`copy_`: the floor, no allocation), (b) Horovod's own commit (`copy.deepcopy` of the
state_dict), (c) `state.commit()` into the node-local store (/dev/shm), (d) `state.commit()` kept in memory
(no store). Medians; the headline is (c)/(a), the goal <= 2; (c)/(a') shows what is left above a bare memcpy.
`steps`: under the elastic driver, blocks of training steps with a commit every 10 steps alternate with blocks
without commits; the median paired ratio is the steady-state cost of elastic training.
`recovery`: runs tests/elastic/train_program.py under the elastic driver, SIGKILLs rank 1 after step 5 and
stamps every output line as it arrives: failure -> driver relaunch -> next world resumed -> first step.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _model(mb: float) -> Any:
    import torch

    width = 1024
    layers = max(1, round(mb * 2**20 / 4 / (width * width + width)))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def bench_commit(mb: float, rounds: int) -> None:
    import torch

    import hpcring.torch as hvd

    hvd.init()
    model = _model(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=shm, prefix="hpcring-bench-elastic-") as directory:
        os.environ["HPCRING_ELASTIC_DIR"] = directory
        stored = hvd.elastic.TorchState(model, optimizer, epoch=0)
        del os.environ["HPCRING_ELASTIC_DIR"]
        memory = hvd.elastic.TorchState(model, optimizer, epoch=0)
        times: dict[str, list[float]] = {
            "clone": [],
            "copy_into": [],
            "deepcopy": [],
            "commit_shm": [],
            "commit_memory": [],
        }
        keep: Any = None
        kept = [t.detach().clone() for t in model.state_dict().values()]
        for _ in range(rounds):
            for name, fn in (
                ("clone", lambda: [t.detach().clone() for t in model.state_dict().values()]),
                (
                    "copy_into",
                    lambda: [k.copy_(t) for k, t in zip(kept, model.state_dict().values(), strict=True)],
                ),
                ("deepcopy", lambda: copy.deepcopy(model.state_dict())),
                ("commit_shm", stored.commit),
                ("commit_memory", memory.commit),
            ):
                keep = None  # each copy replaces the last, as a commit does
                t0 = time.perf_counter()
                keep = fn()
                times[name].append(time.perf_counter() - t0)
        del keep
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"state {nbytes / 2**20:.1f} MiB, {rounds} rounds, medians:")
        for name, value in med.items():
            print(
                f"  {name:14s} {value * 1e3:8.1f} ms  {nbytes / value / 2**30:6.2f} GiB/s  "
                f"x{value / med['clone']:.2f} of clone, x{value / med['copy_into']:.2f} of copy_into"
            )


def bench_steps(steps: int, block: int) -> None:
    import torch

    import hpcring.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def block_time(n: int, commit: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
            state.step += 1
            if commit and state.step % 10 == 0:
                state.commit()
        return (time.perf_counter() - t0) / n

    @hvd.elastic.run
    def run(state: Any) -> tuple[list[float], list[float]]:
        block_time(block, False)  # warm-up
        on: list[float] = []
        off: list[float] = []
        for i in range(steps // block):
            order = (False, True) if i % 2 == 0 else (True, False)
            for commit in order:
                (on if commit else off).append(block_time(block, commit))
        return on, off

    on, off = run(state)
    if hvd.rank() == 0:
        ratio = statistics.median(a / b for a, b in zip(on, off, strict=True))
        where = "node-local store" if os.environ.get("HPCRING_ELASTIC_DIR") else "memory"
        print(
            f"{hvd.size()} ranks, {steps} steps per mode in alternating blocks of {block}: "
            "step without commits "
            f"{statistics.median(off) * 1e3:.2f} ms, with a commit every 10 steps ({where}) "
            f"{statistics.median(on) * 1e3:.2f} ms, median paired ratio {ratio:.3f}"
        )


_KILL = re.compile(r"KILL rank=\d+ step=\d+ t=(\S+)")


def bench_recovery(np: int, repeat: int) -> None:
    program = ROOT / "tests" / "elastic" / "train_program.py"
    hosts = ",".join(f"127.0.0.{i + 1}:1" for i in range(np))
    rows = []
    for _ in range(repeat):
        argv = [sys.executable, "-m", "hpcring", "run", "-H", hosts, "--min-np", str(np - 1), "--"]
        argv += [sys.executable, "-W", "ignore", str(program), "--kill-rank", "1", "--kill-step", "5"]
        proc = subprocess.Popen(
            ["timeout", "-k", "5", "300", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        marks: dict[str, float] = {}
        for line in proc.stdout:
            now = time.time()
            if (m := _KILL.search(line)) and "kill" not in marks:
                marks["kill"] = float(m.group(1))
            elif "world 1:" in line and "relaunch" not in marks:
                marks["relaunch"] = now
            elif "WORLD gen=1" in line and "resumed" not in marks:
                marks["resumed"] = float(line.rsplit("t=", 1)[1])
            elif "resumed" in marks and "STEP" in line and "first" not in marks:
                marks["first"] = float(line.rsplit("t=", 1)[1])
        assert proc.wait() == 0 and len(marks) == 4, marks
        rows.append(
            (
                marks["relaunch"] - marks["kill"],
                marks["resumed"] - marks["relaunch"],
                marks["first"] - marks["resumed"],
                marks["first"] - marks["kill"],
            )
        )
        print(
            "  teardown {:.2f} s, start + resume {:.2f} s, first step {:.2f} s: recovery {:.2f} s".format(
                *rows[-1]
            )
        )
    print(
        f"{np} -> {np - 1} ranks, median recovery over {repeat}: "
        f"{statistics.median(r[3] for r in rows):.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("commit")
    c.add_argument("--mb", type=float, default=100)
    c.add_argument("--rounds", type=int, default=7)
    s = sub.add_parser("steps")
    s.add_argument("--steps", type=int, default=400)
    s.add_argument("--block", type=int, default=20)
    r = sub.add_parser("recovery")
    r.add_argument("--np", type=int, default=3)
    r.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.what == "commit":
        bench_commit(args.mb, args.rounds)
    elif args.what == "steps":
        bench_steps(args.steps, args.block)
    else:
        bench_recovery(args.np, args.repeat)


if __name__ == "__main__":
    main()
