"""The stall-inspector program in a real 3-rank job: the warning text on rank 0 only, the stall shutdown on
every rank. (tests/ranked/engine runs under the launches declared in tests/ranked/launches.py.)"""

from __future__ import annotations

import re

import pytest
from support import RunRanks


@pytest.mark.mpi
def test_stall_warning_and_shutdown(hpcring_run: RunRanks) -> None:
    np = 3
    proc = hpcring_run(
        np,
        ["{python}", "tests/ranked/engine/stall_program.py"],
        flavour="mpich",
        env={"HPCRING_STALL_CHECK_TIME_SECONDS": "1", "HPCRING_STALL_SHUTDOWN_TIME_SECONDS": "3"},
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    warnings = [line for line in proc.stderr.splitlines() if "missing ranks" in line]
    assert all(line.startswith("[0]<stderr>:") for line in warnings), "only rank 0 reports stalls"
    assert any(
        "'late' (allreduce" in w and "submitted by ranks [0, 1]; missing ranks [2]" in w for w in warnings
    )
    assert any("'never' (allreduce" in w for w in warnings)
    assert "waiting for the remaining ranks for more than 1 s" in proc.stderr
    for r in range(np):
        m = re.search(rf"^\[{r}\]<stdout>:RESULT rank {r}: (.*)$", proc.stdout, re.M)
        assert m, out[-3000:]
        assert m.group(1).startswith("CollectiveError") and "stalled for more than 3 s" in m.group(1), (
            m.group(1)
        )
