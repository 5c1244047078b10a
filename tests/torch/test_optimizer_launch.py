"""Runs the data-parallel tests (tests/ranked/torch_train) inside real multi-rank jobs.

One launch at 2 ranks on one node and one at 4 ranks on 2 emulated nodes cover DistributedOptimizer, the
broadcast helpers, SyncBatchNorm and the data-parallel equivalence proof; the ranked files hold the
assertions, this checks that every rank ran them all and passed.
"""

from __future__ import annotations

import re

import pytest
from support import RunRanks, ranked_pytest

pytest.importorskip("torch")

TESTS = "tests/ranked/torch_train"
SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:(\d+) passed", re.M)


@pytest.mark.mpi
@pytest.mark.parametrize(("np", "nodes"), [(2, None), (4, 2)])
def test_data_parallel_contracts_on_every_rank(hpcring_run: RunRanks, np: int, nodes: int | None) -> None:
    proc = hpcring_run(
        np,
        [*ranked_pytest(TESTS), "-W", "ignore::UserWarning", "-o", "faulthandler_timeout=250"],
        emulate_nodes=nodes,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    passed = {int(r): int(n) for r, n in SUMMARY.findall(proc.stdout)}
    assert sorted(passed) == list(range(np)), out[-3000:]
    assert len(set(passed.values())) == 1, passed  # the same tests passed on every rank
    assert min(passed.values()) >= 68, passed  # all four files were collected, not just one


@pytest.mark.mpi
def test_gradient_buckets_and_optimizer_at_one_rank(hpcring_run: RunRanks) -> None:
    """At one rank nothing is reduced (no hooks, as Horovod), in the first step or any later one: the
    bucket and optimizer tests must still hold there."""
    files = (f"{TESTS}/test_buckets_ranked.py", f"{TESTS}/test_optimizer_ranked.py")
    proc = hpcring_run(1, ranked_pytest(*files), timeout=200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert re.search(r"^\[0\]<stdout>:\d+ passed", proc.stdout, re.M), proc.stdout[-2000:]
