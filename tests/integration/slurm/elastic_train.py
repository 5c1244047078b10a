"""One rank of an elastic training job under Slurm (tests/integration/slurm/test_slurm_elastic.py).

The program of tests/elastic/train_program.py (a small regression model, `hvd.elastic.TorchState` with the
model, its DistributedOptimizer and an `ElasticSampler`, a commit every 2 steps), with what a Slurm node loss
needs: every line names the rank's node (SLURMD_NODENAME), and in the first attempt the rank on --lose-node
either SIGKILLs itself after --lose-step (--how kill: a node that fails takes its ranks) or, with --how wait,
writes `<--signal-dir>/at-step-<K>` and waits there for the test to kill the whole node (its slurmd, its
slurmstepd and this process) from outside. Either way the last commit before the loss is step K-1 (K odd).
`--stop-after` and `--out` build the failure-free run of the same size schedule.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=96)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--commit-every", type=int, default=2)
parser.add_argument("--lose-node", default="")
parser.add_argument("--lose-step", type=int, default=-1)
parser.add_argument("--how", choices=("kill", "wait"), default="kill")
parser.add_argument("--signal-dir", default="")
parser.add_argument("--stop-after", type=int, default=-1, help="return after committing this step")
parser.add_argument("--out", default="", help="rank 0 saves the final weights here")
args = parser.parse_args()

hvd.init()
node = os.environ.get("SLURMD_NODENAME", "?")
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


def lose_the_node() -> None:
    """In the first attempt only: the rank on --lose-node dies here, or waits to be killed with its node."""
    if generation != 0 or node != args.lose_node or state.step != args.lose_step:
        return
    print(
        f"LOSE node={node} rank={hvd.rank()} step={state.step} how={args.how} t={time.time():.3f}", flush=True
    )
    if args.how == "kill":
        # All emulated nodes share this host's /dev/shm; on a real cluster the next world, which leaves this
        # node out, could not read this rank's commits: remove them, so the state must come from the others'.
        for own in Path(os.environ["HPCRING_ELASTIC_DIR"]).glob(f"rank-{hvd.rank()}.*"):
            own.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    (Path(args.signal_dir) / f"at-step-{state.step}").write_text(str(os.getpid()))
    time.sleep(300)  # the test kills the node; the others wait in the next step's allreduce


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> str:
    print(
        f"WORLD gen={generation} size={hvd.size()} rank={hvd.rank()} node={node} step={state.step} "
        f"wsum={weights_sum():.12f} t={time.time():.3f}",
        flush=True,
    )
    while state.epoch < args.epochs:
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.sampler.record_batch(state.batch, args.batch)
            state.batch += 1
            state.step += 1
            print(f"STEP {state.step} size={hvd.size()} rank={hvd.rank()} t={time.time():.3f}", flush=True)
            lose_the_node()
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
print(f"END {result} size={hvd.size()} rank={hvd.rank()} node={node} step={state.step}", flush=True)
