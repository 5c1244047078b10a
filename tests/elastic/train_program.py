"""A small elastic training program shaped like Horovod's examples/elastic/pytorch, for tests/elastic.

Every rank prints `WORLD`, `STEP` and `KILL` lines with wall-clock times, so the test can check the schedule
of world sizes and measure recovery (failure -> first completed step after it). Flags steer the failures.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=96)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--commit-every", type=int, default=2)
parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself ...")
parser.add_argument("--kill-step", type=int, default=-1, help="... after this step, in every world listed")
parser.add_argument("--kill-worlds", default="0", help="comma-separated generations in which to kill")
parser.add_argument("--stop-after", type=int, default=-1, help="return after committing this step")
parser.add_argument("--grow-file", default="", help="at --grow-step rank 0 appends --grow-host to this file")
parser.add_argument("--grow-step", type=int, default=-1)
parser.add_argument("--grow-host", default="")
parser.add_argument("--drop-host", default="", help="... or removes this host's line from it")
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--out", default="", help="rank 0 saves the final weights here")
args = parser.parse_args()

hvd.init()
generation = int(os.environ.get("HPCRING_ELASTIC_GENERATION", "0"))
torch.manual_seed(0)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1234)
features = torch.randn(args.samples, 8, generator=g)
targets = features @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(args.samples, 1, generator=g)
dataset = torch.utils.data.TensorDataset(features, targets)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def on_reset() -> None:
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, step=0)
state.register_reset_callbacks([on_reset])


def weights_sum() -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> str:
    print(
        f"WORLD gen={generation} size={hvd.size()} rank={hvd.rank()} step={state.step} "
        f"epoch={state.epoch} wsum={weights_sum():.12f} t={time.time():.3f}",
        flush=True,
    )
    kill_worlds = {int(w) for w in args.kill_worlds.split(",") if w}
    while state.epoch < args.epochs:
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.sampler.record_batch(state.batch, args.batch)
            state.batch += 1
            state.step += 1
            time.sleep(args.step_sleep)
            print(f"STEP {state.step} size={hvd.size()} t={time.time():.3f}", flush=True)
            if hvd.rank() == args.kill_rank and state.step == args.kill_step and generation in kill_worlds:
                print(f"KILL rank={hvd.rank()} step={state.step} t={time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if state.step == args.grow_step and hvd.rank() == 0 and generation == 0 and args.grow_file:
                with open(args.grow_file) as f:
                    lines = [line for line in f if not args.drop_host or not line.startswith(args.drop_host)]
                with open(args.grow_file, "w") as f:
                    f.write("".join(lines) + (f"{args.grow_host}\n" if args.grow_host else ""))
            if state.step % args.commit_every == 0:
                state.commit()
            if state.step == args.stop_after:
                return "stopped"
        state.epoch += 1
        state.batch = 0
        state.sampler.set_epoch(state.epoch)
        state.commit()
    return "done"


result = train(state)
if args.out and hvd.rank() == 0:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out)
print(
    f"END {result} size={hvd.size()} rank={hvd.rank()} step={state.step} wsum={weights_sum():.12f}",
    flush=True,
)
