"""HOROVOD_AUTOTUNE at optimizer steps: time steps on rank 0, switch settings on every rank at the same step.

Every rank calls `on_step()` at the start of each `DistributedOptimizer.step()`. Every `steps_per_sample`
steps, and exactly `total_samples + 1` times in all (a number every rank computes from the agreed settings),
each rank submits `Engine.tune`: rank 0 with the autotuner's next setting, the others with None. The engine
applies rank 0's values on every rank when that op executes, so the switch lands at the same point of every
rank's op sequence and fusion layouts keep agreeing. Rank 0 scores each sample by steps per second between two
switch points; after the last one nothing more is submitted and the chosen setting stays.

A script without DistributedOptimizer (its own allreduce loop) is not tuned: its steps are not visible here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hpcring.engine.tuning_search import AutotuneOptions, Autotuner, Setting, autotune_options
from hpcring.errors import ConfigError
from hpcring.torch import basics
from hpcring.torch.functions import allgather_object

log = logging.getLogger("hpcring.autotune")


class StepAutotune:
    """One per engine (per `init()`), shared by every DistributedOptimizer of the process."""

    def __init__(
        self,
        engine: Any,
        rank: int,
        options: AutotuneOptions,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._engine = engine
        start = Setting(engine.settings.fusion_threshold, engine.settings.cycle_time_ms)
        self._tuner = Autotuner(start, options) if rank == 0 else None
        self._every = options.steps_per_sample
        self._switches_left = options.total_samples + 1
        self._steps = 0
        self._clock = clock
        self._since = 0.0

    @property
    def active(self) -> bool:
        return self._switches_left > 0

    @property
    def chosen(self) -> Setting | None:
        """Rank 0's final choice (None elsewhere, or while the search runs)."""
        return self._tuner.best if self._tuner is not None else None

    def on_step(self) -> None:
        """Called at the start of every optimizer step, on every rank."""
        if not self._switches_left:
            return
        self._steps += 1
        if (self._steps - 1) % self._every:
            return
        self._switches_left -= 1
        proposal = self._next_setting()
        handle = self._engine.tune(*proposal) if proposal else self._engine.tune()
        in_force = handle.wait()
        if not self._switches_left and self._tuner is not None:
            log.info("autotune finished: fusion threshold %d bytes, cycle time %g ms", *in_force)

    def _next_setting(self) -> tuple[int, float] | None:
        """Rank 0: score the sample that just ended and return the next setting; None on other ranks."""
        if self._tuner is None:
            return None
        now = self._clock()
        if self._steps > 1:
            self._tuner.report(self._every / max(now - self._since, 1e-9))
        self._since = now
        s = self._tuner.propose()
        return s.fusion_threshold, s.cycle_time_ms


_current: tuple[Any, StepAutotune | None] | None = None


def on_step(process_set: Any) -> None:
    """DistributedOptimizer.step's hook: one step of the search (nothing once it is over or when off)."""
    global _current
    engine = basics.engine()
    if _current is None or _current[0] is not engine:
        _current = (engine, _start(engine, process_set))
    tuner = _current[1]
    if tuner is not None:
        tuner.on_step()


def _start(engine: Any, process_set: Any) -> StepAutotune | None:
    """A new search for a new engine (each `init()`), when HOROVOD_AUTOTUNE is on and agreed by every rank."""
    options = autotune_options()
    if not options.enabled:
        return None
    if process_set is not None and process_set.ranks != list(range(basics.size())):
        log.warning(
            "HOROVOD_AUTOTUNE tunes optimizers over every rank only; this one is over %s", process_set
        )
        return None
    every = allgather_object(options)
    if any(o != options for o in every):
        raise ConfigError(
            "HOROVOD_AUTOTUNE and its HOROVOD_AUTOTUNE_* settings must be the same on every rank; got "
            + "; ".join(f"rank {r}: {o}" for r, o in enumerate(every))
        )
    return StepAutotune(engine, basics.rank(), options)
