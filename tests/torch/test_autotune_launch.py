"""Launches tests/ranked/autotune under the real launcher with HOROVOD_AUTOTUNE on (small samples, so the
whole search fits in a short run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import RunRanks, ranked_pytest

TESTS = "tests/ranked/autotune"


@pytest.mark.mpi
@pytest.mark.parametrize("np", [1, 2, 4])
def test_autotune_on_every_rank(hpcring_run: RunRanks, tmp_path: Path, np: int) -> None:
    env = {
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "autotune.csv"),
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6",
        "HPCRING_ELASTIC": "1" if np == 1 else "0",  # one rank reduces only in elastic mode, as Horovod
    }
    proc = hpcring_run(np, [*ranked_pytest(TESTS), "-W", "ignore::UserWarning"], env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
