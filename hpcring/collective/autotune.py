"""HOROVOD_AUTOTUNE: pick the fusion threshold and cycle time from measured throughput during the first steps.

Horovod scores each setting by the bytes its engine reduced per second over a sample of cycles and searches
with Bayesian optimisation. hpcring keeps the score and replaces the search with a coordinate search over a
short grid: first the fusion threshold at the starting cycle time, then the cycle time at the best threshold,
then one more sample each of the winner and of the starting setting, keeping the better. The grid covers what
matters on the models in benchmarks/ (fusion from 1 MiB to 128 MiB, cycle time from 0.5 ms to 10 ms), every
setting is scored with the same number of cycles, and the search ends after at most `max_samples` samples,
so a job tunes during its first few hundred steps and then runs with fixed settings.

Only the rank that decides (rank 0 of the global set) runs an `Autotuner`; the engine carries its proposals to
every rank in the cycle's agreement vector, so every rank switches at the same cycle (the fusion layout must
agree). This module is pure logic: the engine feeds it `record()` calls and applies what it returns.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcring.config import parse_bool, parse_int

log = logging.getLogger("hpcring.autotune")

MIB = 1 << 20
FUSION_GRID = (1 * MIB, 4 * MIB, 16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB)
CYCLE_GRID_MS = (0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Setting:
    """What the autotuner changes: both decide how requests are grouped into fused collectives."""

    fusion_threshold: int  # bytes
    cycle_time_ms: float

    def encode(self) -> int:
        """A 64-bit word for the engine's agreement vector: threshold bytes in the low 40 bits, the cycle time
        in microseconds above them. All ones (the AND identity) means 'no proposal'."""
        return (round(self.cycle_time_ms * 1000) << 40) | self.fusion_threshold

    @staticmethod
    def decode(word: int) -> Setting | None:
        if word == NO_PROPOSAL:
            return None
        return Setting(word & ((1 << 40) - 1), (word >> 40) / 1000.0)

    def __str__(self) -> str:
        return f"fusion threshold {self.fusion_threshold / MIB:g} MiB, cycle time {self.cycle_time_ms:g} ms"


NO_PROPOSAL = (1 << 64) - 1


@dataclass(frozen=True)
class AutotuneOptions:
    """HOROVOD_AUTOTUNE and its companions (HPCRING_* first, as every engine setting)."""

    enabled: bool = False
    log_path: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20


def _get(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for var in (f"HPCRING_{name}", f"HOROVOD_{name}"):
        if var in env and env[var].strip():
            return var, env[var].strip()
    return None


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
class _Sample:
    setting: Setting
    phase: str
    cycles: int = 0
    nbytes: int = 0
    t0: float = 0.0


@dataclass
class Autotuner:
    """The decider's search state. Feed it every cycle that moved data; it answers with the next setting."""

    start: Setting
    options: AutotuneOptions = field(default_factory=AutotuneOptions)
    clock: Callable[[], float] = time.perf_counter
    scores: list[tuple[str, Setting, float]] = field(default_factory=list)
    best: Setting | None = None  # the final choice, once done

    def __post_init__(self) -> None:
        warm = [("warmup", self.start)] * self.options.warmup_samples
        self._queue: list[tuple[str, Setting]] = [*warm, *search_plan(self.start, self.options.max_samples)]
        self._sample: _Sample | None = None
        self._samples_left = self.options.max_samples
        self._writer = _CsvLog(self.options.log_path) if self.options.log_path else None

    @property
    def done(self) -> bool:
        return self.best is not None

    def first(self) -> Setting:
        """The setting to put in force before the first sample."""
        return self._queue[0][1]

    def record(self, nbytes: int, in_force: Setting) -> Setting | None:
        """One cycle that moved `nbytes` under `in_force`; returns a setting to switch to, or None.

        A sample's score is bytes per second between the end of its first cycle and the end of its last, so
        cycles count whole; cycles run under any other setting than the one being sampled (the switch takes
        one cycle to reach every rank) are not counted."""
        if self.done or not self._queue:
            return None
        phase, want = self._queue[0]
        if in_force != want:
            return want
        now = self.clock()
        s = self._sample
        if s is None or s.setting != want:
            self._sample = _Sample(want, phase, 1, 0, now)
            return None
        s.cycles += 1
        s.nbytes += nbytes
        if s.cycles < self.options.steps_per_sample:
            return None
        self._finish(s, s.nbytes / max(now - s.t0, 1e-9))
        return self._next()

    def _finish(self, s: _Sample, score: float) -> None:
        self._queue.pop(0)
        self._sample = None
        self._samples_left -= 1
        if s.phase != "warmup":
            self.scores.append((s.phase, s.setting, score))
        if self._writer:
            self._writer.row(s.phase, s.setting, score)
        log.info("autotune sample (%s): %s -> %.1f MB/s", s.phase, s.setting, score / 1e6)

    def _next(self) -> Setting | None:
        """Queue the next phase when this one is scored; the final choice when the search is over."""
        if not self._queue:
            phases = [p for p, _, _ in self.scores]
            if phases[-1] == "fusion":
                f = self._best("fusion").fusion_threshold
                room = max(0, self._samples_left - 2)
                cycles = [c for c in CYCLE_GRID_MS if c != self.start.cycle_time_ms][:room]
                self._queue = [("cycle", Setting(f, c)) for c in cycles]
                if not self._queue:
                    return self._next_confirm()
            elif phases[-1] == "cycle":
                return self._next_confirm()
            else:
                return self._conclude()
        return self._queue[0][1]

    def _next_confirm(self) -> Setting | None:
        """One more sample of the winner and of the start, back to back, so drift over time cannot crown a
        setting that only met a quieter moment."""
        winner = self._best("fusion", "cycle")
        if winner == self.start or self._samples_left < 2:
            return self._conclude()
        self._queue = [("confirm", winner), ("confirm", self.start)]
        return self._queue[0][1]

    def _best(self, *phases: str) -> Setting:
        """The best-scored setting of these phases (the fusion winner, scored at the starting cycle time,
        competes with the cycle phase's settings)."""
        pool = [(score, s) for p, s, score in self.scores if p in phases]
        return max(pool, key=lambda item: item[0])[1]

    def _conclude(self) -> Setting:
        confirm = {s: score for p, s, score in self.scores if p == "confirm"}
        candidates = confirm or {s: score for _, s, score in self.scores}
        self.best = max(candidates, key=lambda s: candidates[s]) if candidates else self.start
        log.warning("autotune chose %s after %d samples", self.best, len(self.scores))
        if self._writer:
            self._writer.row("chosen", self.best, candidates.get(self.best, float("nan")))
            self._writer.close()
        return self.best


class _CsvLog:
    """HOROVOD_AUTOTUNE_LOG: one row per scored sample, then the choice (written by the decider only)."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="")  # noqa: SIM115 - closed when the search ends
        self._csv = csv.writer(self._file)
        self._csv.writerow(["phase", "fusion_threshold_bytes", "cycle_time_ms", "bytes_per_second"])

    def row(self, phase: str, setting: Setting, score: float) -> None:
        self._csv.writerow([phase, setting.fusion_threshold, setting.cycle_time_ms, f"{score:.1f}"])
        self._file.flush()

    def close(self) -> None:
        self._file.close()
