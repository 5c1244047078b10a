"""HOROVOD_AUTOTUNE: pick the fusion threshold and cycle time from measured throughput during the first steps.

Horovod scores a setting by the bytes its engine reduced per second and searches with Bayesian optimisation.
hpcring scores it by training steps per second (the same bytes move every step, so this is Horovod's score
with the compute time the settings also change included) and runs a coordinate search over a short grid
(`FUSION_GRID`, then `CYCLE_GRID_MS` at the best threshold, then the winner against the start once more),
ending after at most `max_samples` scored samples (docs/guide/torch.md, "Autotuning").

Only the rank that decides (rank 0 of the global set) runs an `Autotuner`. This module is pure search logic: a
driver runs each proposed setting for one sample, reports its score, and applies the next proposal on every
rank through `Engine.tune` (a collective op, so every rank switches at the same point of its op sequence and
the fusion layout agrees): `hpcring/torch/autotune.py` does that at optimizer steps.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcring.config import lookup, parse_bool, parse_int

log = logging.getLogger("hpcring.autotune")

MIB = 1 << 20
FUSION_GRID = (1 * MIB, 4 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB)
CYCLE_GRID_MS = (0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Setting:
    """What the autotuner changes: both decide how requests are grouped into fused collectives."""

    fusion_threshold: int  # bytes
    cycle_time_ms: float

    def __str__(self) -> str:
        return f"fusion threshold {self.fusion_threshold / MIB:g} MiB, cycle time {self.cycle_time_ms:g} ms"


@dataclass(frozen=True)
class AutotuneOptions:
    """HOROVOD_AUTOTUNE and its companions (HPCRING_* first, as every engine setting)."""

    enabled: bool = False
    log_path: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20  # scored samples, warm-up not included

    @property
    def total_samples(self) -> int:
        """The most samples a search takes, warm-up included: every rank can count the switch points."""
        return self.warmup_samples + self.max_samples


def _get(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """HPCRING_<name> or HOROVOD_<name>, as every engine setting reads them; an empty value means unset."""
    found = lookup(env, name)
    return found if found and found[1] else None


def autotune_options(env: Mapping[str, str] | None = None) -> AutotuneOptions:
    """Read the autotune settings; ConfigError naming the variable on a bad value."""
    env = os.environ if env is None else env
    found = _get(env, "AUTOTUNE")
    enabled = parse_bool(*found) if found else False
    found = _get(env, "AUTOTUNE_LOG")
    log_path = found[1] if found else None
    ints = {}
    for name, key, default, minimum in (
        ("AUTOTUNE_WARMUP_SAMPLES", "warmup_samples", 3, 0),
        ("AUTOTUNE_STEPS_PER_SAMPLE", "steps_per_sample", 10, 2),
        ("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "max_samples", 20, 2),
    ):
        found = _get(env, name)
        ints[key] = parse_int(*found, minimum=minimum) if found else default
    return AutotuneOptions(enabled=enabled, log_path=log_path, **ints)


def search_plan(start: Setting, max_samples: int) -> list[tuple[str, Setting]]:
    """The settings the coordinate search scores in its first phase (fusion thresholds at the starting cycle
    time, the starting threshold first), truncated to what `max_samples` leaves room for."""
    grid = [start.fusion_threshold, *(f for f in FUSION_GRID if f != start.fusion_threshold)]
    room = max(1, max_samples - len(CYCLE_GRID_MS) - 2)
    return [("fusion", Setting(f, start.cycle_time_ms)) for f in grid[:room]]


@dataclass
class Autotuner:
    """The decider's search state: `propose()` the setting to run next, `report()` its measured score."""

    start: Setting
    options: AutotuneOptions = field(default_factory=AutotuneOptions)
    scores: list[tuple[str, Setting, float]] = field(default_factory=list)
    best: Setting | None = None  # the final choice, once done

    def __post_init__(self) -> None:
        warm = [("warmup", self.start)] * self.options.warmup_samples
        self._queue: list[tuple[str, Setting]] = [*warm, *search_plan(self.start, self.options.max_samples)]
        self._samples_left = self.options.max_samples
        self._writer = _CsvLog(self.options.log_path) if self.options.log_path else None

    @property
    def done(self) -> bool:
        return self.best is not None

    def propose(self) -> Setting:
        """The setting the next sample runs with; the final choice once the search is over."""
        return self.best if self.best is not None else self._queue[0][1]

    def report(self, score: float) -> None:
        """The score (higher is better: bytes or steps per second) of a sample run with `propose()`'s
        setting."""
        if self.done:
            return
        phase, setting = self._queue.pop(0)
        if phase != "warmup":  # as Horovod's, max_samples counts the scored samples, not the warm-up
            self._samples_left -= 1
            self.scores.append((phase, setting, score))
        if self._writer:
            self._writer.row(phase, setting, score)
        log.info("autotune sample (%s): %s -> %.4g", phase, setting, score)
        if not self._queue:
            self._next_phase(phase)

    def _next_phase(self, finished: str) -> None:
        """Queue the phase after `finished`, or conclude."""
        if finished in ("warmup", "fusion"):
            f = self._best("fusion").fusion_threshold
            room = max(0, self._samples_left - 2)
            cycles = [c for c in CYCLE_GRID_MS if c != self.start.cycle_time_ms][:room]
            self._queue = [("cycle", Setting(f, c)) for c in cycles]
            if self._queue:
                return
        if finished != "confirm":
            winner = self._best("fusion", "cycle")
            if winner != self.start and self._samples_left >= 2:
                # One more sample of the winner and of the start, back to back, so drift over time cannot
                # crown a setting that only met a quieter moment.
                self._queue = [("confirm", winner), ("confirm", self.start)]
                return
        self._conclude()

    def _best(self, *phases: str) -> Setting:
        """The best-scored setting of these phases (the fusion winner, scored at the starting cycle time,
        competes with the cycle phase's settings)."""
        pool = [(score, s) for p, s, score in self.scores if p in phases]
        return max(pool, key=lambda item: item[0])[1] if pool else self.start

    def _conclude(self) -> None:
        confirm = {s: score for p, s, score in self.scores if p == "confirm"}
        candidates = confirm or {s: score for _, s, score in self.scores}
        self.best = max(candidates, key=lambda s: candidates[s]) if candidates else self.start
        log.warning("autotune chose %s after %d samples", self.best, len(self.scores))
        if self._writer:
            self._writer.row("chosen", self.best, candidates.get(self.best, float("nan")))
            self._writer.close()


class _CsvLog:
    """HOROVOD_AUTOTUNE_LOG: one row per scored sample, then the choice (written by the decider only)."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="")  # noqa: SIM115 - closed when the search ends
        self._csv = csv.writer(self._file)
        self._csv.writerow(["phase", "fusion_threshold_bytes", "cycle_time_ms", "steps_per_second"])

    def row(self, phase: str, setting: Setting, score: float) -> None:
        self._csv.writerow([phase, setting.fusion_threshold, setting.cycle_time_ms, f"{score:.1f}"])
        self._file.flush()

    def close(self) -> None:
        self._file.close()
