"""Runs the `hpcring.torch` op tests (tests/ranked/torch_ops) inside real multi-rank jobs.

Two launches cover the contract: 2 ranks on one node, and 4 ranks on 2 emulated nodes with HPCRING_TIMELINE
set (the env-var timeline must be a valid Chrome trace). The ranked files hold the assertions; here we check
that every rank ran them all and passed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import RunRanks, ranked_pytest

pytest.importorskip("torch")

TESTS = "tests/ranked/torch_ops"
SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:(\d+) passed", re.M)


def passed_per_rank(stdout: str) -> dict[int, int]:
    return {int(r): int(n) for r, n in SUMMARY.findall(stdout)}


@pytest.mark.mpi
@pytest.mark.parametrize(("np", "nodes"), [(2, None), (4, 2)])
def test_torch_ops_on_every_rank(hpcring_run: RunRanks, tmp_path: Path, np: int, nodes: int | None) -> None:
    timeline = tmp_path / "env-timeline.json"
    proc = hpcring_run(
        np,
        [*ranked_pytest(TESTS), "-W", "ignore::UserWarning", "-o", "faulthandler_timeout=200"],
        emulate_nodes=nodes,
        env={"HPCRING_TIMELINE": str(timeline)},
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    passed = passed_per_rank(proc.stdout)
    assert sorted(passed) == list(range(np)), out[-3000:]
    assert len(set(passed.values())) == 1, passed  # the same tests passed on every rank
    events = json.loads(timeline.read_text())  # rank 0 wrote it; valid JSON means the array was closed
    names = {e["name"] for e in events}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "COLLECTIVE"} <= names, sorted(names)
