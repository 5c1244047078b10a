"""Runs the device data plane tests (tests/ranked/device_plane) inside real multi-rank jobs.

No GPU here: CPU tensors take the device plane with gloo standing in for NCCL (HPCRING_CPU_DEVICE_PLANE=gloo),
which runs the same code as CUDA tensors with NCCL except the CUDA-only lines (benchmarks/gpu_check.sh runs
these tests on a GPU node). Three launches: 2 ranks and 4 ranks on one node (flat process-group allreduce),
and 4 ranks on 2 emulated nodes with the hierarchical allreduce forced (three stages, both cross-node
transports, the stages in the timeline for the device and the host paths).
"""

from __future__ import annotations

import re

import pytest
from support import RunRanks, ranked_pytest

pytest.importorskip("torch")

TESTS = "tests/ranked/device_plane"
SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:(\d+) passed(?:, (\d+) skipped)?", re.M)


@pytest.mark.mpi
@pytest.mark.parametrize(("np", "nodes"), [(2, None), (4, None), (4, 2)])
def test_device_plane_on_every_rank(hpcring_run: RunRanks, np: int, nodes: int | None) -> None:
    env = {"HPCRING_CPU_DEVICE_PLANE": "gloo"}
    if nodes:
        env["HPCRING_ALLREDUCE_ALGORITHM"] = "hierarchical"
    proc = hpcring_run(
        np,
        [*ranked_pytest(TESTS), "-rs", "-W", "ignore::UserWarning", "-o", "faulthandler_timeout=250"],
        emulate_nodes=nodes,
        env=env,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    found = {int(r): (int(p), int(s or 0)) for r, p, s in SUMMARY.findall(proc.stdout)}
    assert sorted(found) == list(range(np)), out[-3000:]
    assert len(set(found.values())) == 1, found  # the same tests passed (and skipped) on every rank
    passed, skipped = found[0]
    assert passed >= 60, found  # every file was collected
    # Only the 2-node launch runs the hierarchical-only tests (cross-node stage, host stages).
    assert skipped == (0 if nodes else 2), out[-3000:]
