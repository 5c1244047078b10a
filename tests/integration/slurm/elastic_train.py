"""One rank of an elastic training job under Slurm (tests/integration/slurm/test_slurm_elastic.py).

The training of tests/elastic/train_program.py (shared: tests/elastic/elastic_trainer.py; a small regression
model, `hvd.elastic.TorchState` with the model, its DistributedOptimizer and an `ElasticSampler`, a commit
every 2 steps), with what a Slurm node loss needs: every line names the rank's node (SLURMD_NODENAME), and in
the first attempt the rank on --lose-node either SIGKILLs itself after --lose-step (--how kill: a node that
fails takes its ranks) or, with --how wait, writes `<--signal-dir>/at-step-<K>` and waits there for the test
to kill the whole node (its slurmd, its slurmstepd and this process) from outside. Either way the last commit
before the loss is step K-1 (K odd). `--stop-after` and `--out` build the failure-free run of the same size
schedule.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "elastic"))
import elastic_trainer  # the training tests/elastic/train_program.py runs too

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
elastic_trainer.add_arguments(parser)
parser.add_argument("--lose-node", default="")
parser.add_argument("--lose-step", type=int, default=-1)
parser.add_argument("--how", choices=("kill", "wait"), default="kill")
parser.add_argument("--signal-dir", default="")
args = parser.parse_args()

hvd.init()
node = os.environ.get("SLURMD_NODENAME", "?")
generation = int(os.environ.get("HPCRING_ELASTIC_GENERATION", "0"))
trainer = elastic_trainer.Trainer(args)


def lose_the_node(state: hvd.elastic.TorchState) -> None:
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


def on_world(state: hvd.elastic.TorchState) -> None:
    print(
        f"WORLD gen={generation} size={hvd.size()} rank={hvd.rank()} node={node} step={state.step} "
        f"wsum={trainer.weights_sum():.12f} t={time.time():.3f}",
        flush=True,
    )


def on_step(state: hvd.elastic.TorchState) -> None:
    print(f"STEP {state.step} size={hvd.size()} rank={hvd.rank()} t={time.time():.3f}", flush=True)
    lose_the_node(state)


result = trainer.run(on_world, on_step)
print(f"END {result} size={hvd.size()} rank={hvd.rank()} node={node} step={trainer.state.step}", flush=True)
