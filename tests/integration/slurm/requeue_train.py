"""One rank of a training job that outlives its Slurm time limit (test_slurm_requeue.py).

The training of tests/elastic/train_program.py (shared: tests/elastic/elastic_trainer.py; `hvd.elastic`
with a commit every 2 steps), slowed by --step-sleep (the compute of a bigger model) so that it needs several
runs of a short job. --slow-runs N slows only the first N runs: slurmctld checks time limits every 30 s, so a
run's length varies by 30 s and no fixed amount of work both outlasts three runs and fits in a fourth; the
runs after the N-th train at full speed and end before their own warning. The job names
HPCRING_CHECKPOINT_DIR: on the warning the ranks checkpoint there and leave to be requeued, and each run
resumes from there. Every line carries the job's restart count, so the test can tell the runs apart.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "elastic"))
import elastic_trainer  # the training tests/elastic/train_program.py runs too

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
elastic_trainer.add_arguments(parser)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--slow-runs", type=int, default=-1, help="sleep only in runs 0..N-1 (-1: in every run)")
args = parser.parse_args()

hvd.init()
run = os.environ.get("SLURM_RESTART_COUNT", "0")
step_sleep = args.step_sleep if args.slow_runs < 0 or int(run) < args.slow_runs else 0.0
trainer = elastic_trainer.Trainer(args)


def on_world(state: hvd.elastic.TorchState) -> None:
    if hvd.rank() == 0:
        print(f"WORLD run={run} size={hvd.size()} step={state.step} t={time.time():.3f}", flush=True)


def on_step(state: hvd.elastic.TorchState) -> None:
    time.sleep(step_sleep)
    if hvd.rank() == 0:
        print(f"STEP {state.step} run={run} t={time.time():.3f}", flush=True)


result = trainer.run(on_world, on_step)
if hvd.rank() == 0:
    print(f"END {result} run={run} step={trainer.state.step}", flush=True)
