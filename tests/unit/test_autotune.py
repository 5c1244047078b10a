"""The autotuner's search, on a simulated engine whose throughput depends on the setting."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from hpcring.collective.autotune import (
    CYCLE_GRID_MS,
    FUSION_GRID,
    MIB,
    NO_PROPOSAL,
    AutotuneOptions,
    Autotuner,
    Setting,
    autotune_options,
)
from hpcring.errors import ConfigError

DEFAULT = Setting(64 * MIB, 1.0)


class SimulatedEngine:
    """Cycles that each move `nbytes`, taking a time that depends on the setting in force (with noise)."""

    def __init__(self, seconds_per_cycle: dict[Setting, float] | None = None, noise: float = 0.0) -> None:
        self.now = 0.0
        self.in_force = DEFAULT
        self.cost = seconds_per_cycle or {}
        self.noise = noise
        self.cycles = 0

    def clock(self) -> float:
        return self.now

    def run(self, tuner: Autotuner, *, limit: int = 10_000) -> int:
        self.in_force = tuner.first()
        while not tuner.done and self.cycles < limit:
            self.cycles += 1
            base = self.cost.get(self.in_force, 2e-3)
            jitter = 1 + self.noise * math.sin(self.cycles * 12.9898)  # deterministic wobble
            self.now += base * jitter
            proposal = tuner.record(1 << 20, self.in_force)
            if proposal is not None:
                self.in_force = proposal  # the engine switches every rank at the next cycle
        return self.cycles


def _landscape(best: Setting) -> dict[Setting, float]:
    """Cycle cost grows with the distance from `best` on the grid."""
    cost = {}
    for f in FUSION_GRID:
        for c in (*CYCLE_GRID_MS, 1.0):
            d = abs(math.log2(f / best.fusion_threshold)) + abs(math.log2(c / best.cycle_time_ms))
            cost[Setting(f, c)] = 1e-3 * (1 + 0.3 * d)
    return cost


@pytest.mark.parametrize("best", [Setting(16 * MIB, 2.5), Setting(64 * MIB, 1.0), Setting(1 * MIB, 0.5)])
def test_search_finds_the_best_setting_of_the_grid(best: Setting) -> None:
    engine = SimulatedEngine(_landscape(best), noise=0.05)
    tuner = Autotuner(DEFAULT, AutotuneOptions(enabled=True), clock=engine.clock)
    cycles = engine.run(tuner)
    assert tuner.best == best
    assert len(tuner.scores) <= 20 - 3  # max_samples includes the warm-up samples
    assert cycles < 400, cycles  # within the first few hundred cycles


def test_never_worse_than_the_start_when_the_start_is_best() -> None:
    engine = SimulatedEngine(_landscape(DEFAULT))
    tuner = Autotuner(DEFAULT, AutotuneOptions(enabled=True, warmup_samples=0), clock=engine.clock)
    engine.run(tuner)
    assert tuner.best == DEFAULT


def test_cycles_under_another_setting_are_not_scored() -> None:
    tuner = Autotuner(DEFAULT, AutotuneOptions(warmup_samples=0, steps_per_sample=2), clock=lambda: 0.0)
    want = tuner.first()
    other = Setting(1 * MIB, 9.0)
    for _ in range(5):
        assert tuner.record(1000, other) == want  # asks again until the switch is in force
    assert tuner.scores == []


def test_max_samples_bounds_the_search() -> None:
    engine = SimulatedEngine(_landscape(Setting(4 * MIB, 5.0)))
    tuner = Autotuner(DEFAULT, AutotuneOptions(warmup_samples=1, max_samples=6), clock=engine.clock)
    engine.run(tuner)
    assert tuner.done and len(tuner.scores) <= 5


def test_the_log_lists_every_sample_and_the_choice(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "autotune.csv"
    engine = SimulatedEngine(_landscape(Setting(32 * MIB, 2.5)))
    tuner = Autotuner(DEFAULT, AutotuneOptions(log_path=str(path)), clock=engine.clock)
    engine.run(tuner)
    rows = list(csv.DictReader(path.open()))
    assert [r["phase"] for r in rows][:3] == ["warmup"] * 3
    assert rows[-1]["phase"] == "chosen"
    assert int(rows[-1]["fusion_threshold_bytes"]) == tuner.best.fusion_threshold  # type: ignore[union-attr]
    assert len(rows) == 3 + len(tuner.scores) + 1


def test_setting_travels_as_one_word() -> None:
    for s in (DEFAULT, Setting(0, 0.0), Setting(128 * MIB, 10.0), Setting(3, 0.5)):
        word = s.encode()
        assert 0 <= word < NO_PROPOSAL and Setting.decode(word) == s
    assert Setting.decode(NO_PROPOSAL) is None
    assert Setting.decode(NO_PROPOSAL & DEFAULT.encode()) == DEFAULT  # AND with the identity keeps it


def test_options_from_the_environment() -> None:
    assert not autotune_options({}).enabled
    opts = autotune_options(
        {
            "HOROVOD_AUTOTUNE": "1",
            "HOROVOD_AUTOTUNE_LOG": "/x/a.csv",
            "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "4",
            "HPCRING_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "9",
        }
    )
    assert opts == AutotuneOptions(True, "/x/a.csv", 1, 4, 9)
    with pytest.raises(ConfigError, match="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"):
        autotune_options({"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1"})
    with pytest.raises(ConfigError, match="HOROVOD_AUTOTUNE="):
        autotune_options({"HOROVOD_AUTOTUNE": "maybe"})
