"""A small elastic training program shaped like Horovod's examples/elastic/pytorch, for tests/elastic.

Every rank prints `WORLD`, `STEP` and `KILL` lines with wall-clock times, so the test can check the schedule
of world sizes and measure recovery (failure -> first completed step after it). Flags steer the failures.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import elastic_trainer  # this file's folder is on sys.path when it runs as a script

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
elastic_trainer.add_arguments(parser)
parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself ...")
parser.add_argument("--kill-step", type=int, default=-1, help="... after this step, in every world listed")
parser.add_argument("--kill-worlds", default="0", help="comma-separated generations in which to kill")
parser.add_argument("--raise-rank", type=int, default=-1, help="this rank raises RuntimeError ...")
parser.add_argument("--raise-steps", default="", help="... after step S of world G, for each G:S listed")
parser.add_argument("--freeze", action="store_true", help="SIGSTOP instead of SIGKILL: the rank hangs")
parser.add_argument("--grow-file", default="", help="at --grow-step rank 0 appends --grow-host to this file")
parser.add_argument("--grow-step", type=int, default=-1)
parser.add_argument("--grow-host", default="")
parser.add_argument("--drop-host", default="", help="... or removes this host's line from it")
parser.add_argument("--step-sleep", type=float, default=0.0)
args = parser.parse_args()

hvd.init()
generation = int(os.environ.get("HPCRING_ELASTIC_GENERATION", "0"))
kill_worlds = {int(w) for w in args.kill_worlds.split(",") if w}
raise_steps = {int(g): int(s) for g, s in (item.split(":") for item in args.raise_steps.split(",") if item)}
trainer = elastic_trainer.Trainer(args)


HOROVOD_NAMES = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")


def on_world(state: hvd.elastic.TorchState) -> None:
    # horovodrun's rank variables as this world's launcher set them, next to what hvd says
    horovod = " ".join(f"{n}={os.environ.get('HOROVOD_' + n, '-')}" for n in HOROVOD_NAMES)
    hvd_place = (
        hvd.rank(),
        hvd.size(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
    )
    print(f"HVDENV gen={generation} hvd={','.join(map(str, hvd_place))} {horovod}", flush=True)
    print(
        f"WORLD gen={generation} size={hvd.size()} rank={hvd.rank()} step={state.step} "
        f"epoch={state.epoch} wsum={trainer.weights_sum():.12f} t={time.time():.3f}",
        flush=True,
    )


def on_step(state: hvd.elastic.TorchState) -> None:
    time.sleep(args.step_sleep)
    print(f"STEP {state.step} size={hvd.size()} t={time.time():.3f}", flush=True)
    if hvd.rank() == args.kill_rank and state.step == args.kill_step and generation in kill_worlds:
        print(f"KILL rank={hvd.rank()} step={state.step} t={time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP if args.freeze else signal.SIGKILL)
    if hvd.rank() == args.raise_rank and raise_steps.get(generation) == state.step:
        raise RuntimeError(f"rank {hvd.rank()} fails in world {generation}")  # this host's fault, say
    if state.step == args.grow_step and hvd.rank() == 0 and generation == 0 and args.grow_file:
        with open(args.grow_file) as f:
            lines = [line for line in f if not args.drop_host or not line.startswith(args.drop_host)]
        with open(args.grow_file, "w") as f:
            f.write("".join(lines) + (f"{args.grow_host}\n" if args.grow_host else ""))


result = trainer.run(on_world, on_step)
print(
    f"END {result} size={hvd.size()} rank={hvd.rank()} step={trainer.state.step} "
    f"wsum={trainer.weights_sum():.12f}",
    flush=True,
)
