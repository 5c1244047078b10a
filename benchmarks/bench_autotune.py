"""HOROVOD_AUTOTUNE against the defaults, in one launch: does the search pick settings at least as good?

Run under the launcher with the autotuner on, e.g.

    HOROVOD_AUTOTUNE=1 hpcring run -np 2 -- python benchmarks/bench_autotune.py --model mlp200

Every rank trains the model with DistributedOptimizer until the search is over (HOROVOD_AUTOTUNE_* as set),
then alternates rounds of `--steps` timed steps under the defaults (64 MiB fusion threshold, 1 ms cycle time)
and under the chosen setting, switched on every rank through `Engine.tune`, so drift on a loaded machine hits
both alike. Rank 0 prints one JSON line: the median step time of each and their ratio (chosen / defaults;
below 1 means the choice is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_models

import hpcring.torch as hvd
from hpcring.config import DEFAULT_CYCLE_TIME_MS, DEFAULT_FUSION_THRESHOLD
from hpcring.engine.tuning_search import autotune_options
from hpcring.torch import autotune, basics


def _timed_steps(
    model: torch.nn.Module, opt: torch.optim.Optimizer, name: str, steps: int, gen: torch.Generator
) -> float:
    """Seconds per step, median over `steps` steps (rank-local clock; ranks are in lock step)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(steps):
        x, y = ddp_models.batch(name, 32, gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp200", choices=sorted(ddp_models.MODELS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of defaults / chosen, alternated")
    args = parser.parse_args()
    options = autotune_options()
    if not options.enabled:
        sys.exit("set HOROVOD_AUTOTUNE=1: this benchmark measures the autotuner's choice")
    torch.set_num_threads(1)
    hvd.init()
    model = ddp_models.build(args.model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    search_steps = (options.total_samples + 1) * options.steps_per_sample + 1
    t0 = time.perf_counter()
    _timed_steps(model, opt, args.model, search_steps, gen)
    search_s = time.perf_counter() - t0
    engine = basics.engine()
    chosen = (engine.settings.fusion_threshold, engine.settings.cycle_time_ms)
    defaults = (DEFAULT_FUSION_THRESHOLD, DEFAULT_CYCLE_TIME_MS)
    runs: dict[str, list[float]] = {"defaults": [], "chosen": []}
    for _ in range(args.rounds):
        for label, setting in (("defaults", defaults), ("chosen", chosen)):
            engine.tune(*setting).wait()  # every rank, in the same order: the switch is collective
            runs[label].append(_timed_steps(model, opt, args.model, args.steps, gen))
    if hvd.rank() == 0:
        d, c = statistics.median(runs["defaults"]), statistics.median(runs["chosen"])
        state = autotune._current
        samples = len(state[1]._tuner.scores) if state and state[1] and state[1]._tuner else 0
        print(
            json.dumps(
                {
                    "model": args.model,
                    "ranks": hvd.size(),
                    "search_steps": search_steps,
                    "search_s": round(search_s, 2),
                    "scored_samples": samples,
                    "chosen_fusion_mib": chosen[0] / (1 << 20),
                    "chosen_cycle_ms": chosen[1],
                    "defaults_step_ms": round(d * 1e3, 3),
                    "chosen_step_ms": round(c * 1e3, 3),
                    "ratio_chosen_over_defaults": round(c / d, 3),
                }
            ),
            flush=True,
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
