"""Launch the ranked collective tests through `hpcring run` at several world sizes, layouts and MPI flavours.

Each launch runs whole ranked pytest files inside every rank (expectations computed from rank and size, bad
input checked on every rank); here we only check that every rank's pytest passed. Launches are few on purpose:
each costs seconds of process start-up on 2 cores.
"""

from __future__ import annotations

import subprocess

import pytest
from support import RunRanks, ranked_pytest

pytestmark = pytest.mark.mpi

ALL = ("tests/ranked/collective",)
# Node layout matters only to topology and allreduce (hierarchical); the other ops use the world group alone.
LAYOUT = (
    "tests/ranked/collective/test_ranked_collective_topology.py",
    "tests/ranked/collective/test_ranked_collective_allreduce.py",
)


def _check(proc: subprocess.CompletedProcess[str], np: int) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert out.count(" passed") >= np, out[-6000:]  # one pytest summary per rank
    assert " failed" not in out, out[-6000:]


@pytest.mark.parametrize(
    ("np", "flavour", "emulate_nodes", "paths"),
    [
        pytest.param(1, "openmpi", None, ALL, id="openmpi-1"),
        pytest.param(2, "openmpi", None, ALL, id="openmpi-2"),
        pytest.param(4, "openmpi", None, ALL, id="openmpi-4"),
        pytest.param(4, "openmpi", 2, LAYOUT, id="openmpi-2nodes-x2"),
        pytest.param(3, "openmpi", 2, LAYOUT, id="openmpi-heterogeneous-2+1"),
        pytest.param(2, "mpich", None, ALL, id="mpich-2"),
        pytest.param(4, "mpich", 2, LAYOUT, id="mpich-2nodes-x2"),
    ],
)
def test_collectives_under_launcher(
    hpcring_run: RunRanks, np: int, flavour: str, emulate_nodes: int | None, paths: tuple[str, ...]
) -> None:
    proc = hpcring_run(np, ranked_pytest(*paths), flavour=flavour, emulate_nodes=emulate_nodes, timeout=600)
    _check(proc, np)
