"""HOROVOD_AUTOTUNE inside every rank (launched with the HOROVOD_AUTOTUNE* variables set in
tests/ranked/launches.py): every rank ends with rank 0's choice, after the same number of switches,
and training stays data-parallel while the settings change under it."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from hpcring.engine.tuning_search import autotune_options
from hpcring.torch import autotune, basics


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(32, 1))


def test_every_rank_ends_with_rank_zeros_choice(
    hvd: ModuleType, comm: Any, caplog: pytest.LogCaptureFixture, shared_tmp: Path
) -> None:
    options = autotune_options()
    assert options.enabled, "launch with HOROVOD_AUTOTUNE=1"
    n, r = hvd.size(), hvd.rank()
    model = _model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = (options.total_samples + 2) * options.steps_per_sample
    trace = shared_tmp / "timeline.json"
    hvd.start_timeline(str(trace))
    gen = torch.Generator().manual_seed(100 + r)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    hvd.stop_timeline()
    engine = basics.engine()
    assert engine.stats["tunes"] == options.total_samples + 1  # every switch point, on every rank
    in_force = (engine.settings.fusion_threshold, engine.settings.cycle_time_ms)
    assert len({tuple(s) for s in hvd.allgather_object(in_force)}) == 1  # the same settings everywhere
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(weights.unsqueeze(0))
    assert torch.equal(gathered, weights.expand(n, -1)), "ranks diverged while the settings changed"
    state = autotune._current
    assert state is not None and state[1] is not None and not state[1].active
    if r != 0:
        return
    assert any(m.startswith("autotune chose fusion threshold") for m in caplog.messages), caplog.messages
    chosen = state[1].chosen
    assert chosen is not None and (chosen.fusion_threshold, chosen.cycle_time_ms) == in_force
    events = json.loads(trace.read_text())
    tunes = [
        e for e in events if e.get("name") == "TUNE" and e["ph"] == "i"
    ]  # the switches, not the op spans
    assert len(tunes) == options.total_samples + 1
    assert (tunes[-1]["args"]["fusion_threshold"], tunes[-1]["args"]["cycle_time_ms"]) == in_force
    log_path = os.environ["HOROVOD_AUTOTUNE_LOG"]
    rows = list(csv.DictReader(Path(log_path).read_text().splitlines()))
    assert rows[-1]["phase"] == "chosen" and int(rows[-1]["fusion_threshold_bytes"]) == in_force[0]
    assert [row["phase"] for row in rows].count("warmup") == options.warmup_samples
    assert all(float(row["steps_per_second"]) > 0 for row in rows[:-1])
