"""The rankfile `hpcring map --format rankfile` writes binds real Open MPI ranks where the mapping says.

Runs the wheel's Open MPI `mpirun` on this machine (the `local` profile, one core per rank) and reads each
rank's affinity back from the OS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sched_helpers import cli

MPIRUN = Path(sys.executable).parent / "mpirun"


@pytest.mark.skipif(not MPIRUN.exists(), reason="Open MPI wheel (mpirun) not installed in this environment")
def test_rankfile_binds_ranks_to_the_mapped_cpus(tmp_path: Path) -> None:
    ncpu = len(os.sched_getaffinity(0))
    ranks = min(2, ncpu)
    shape = ("map", "--profile", "local", "--ranks-per-node", str(ranks), "--cpus-per-rank", "1")
    mapping = cli(*shape, "--format", "json")
    assert mapping.returncode == 0, mapping.stderr
    expected = {r["rank"]: r["cpus"] for r in json.loads(mapping.stdout)}
    rf = cli(*shape, "--format", "rankfile")
    rankfile = tmp_path / "ranks"
    rankfile.write_text(rf.stdout)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    code = "import os; print(os.environ['OMPI_COMM_WORLD_RANK'], sorted(os.sched_getaffinity(0)))"
    res = subprocess.run(
        [
            "timeout",
            "-k",
            "5",
            "120",
            str(MPIRUN),
            "-n",
            str(ranks),
            "--host",
            f"localhost:{ranks}",
            "--map-by",
            f"rankfile:FILE={rankfile}:HWTCPUS",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    got = {}
    for line in res.stdout.splitlines():
        rank, _, cpus = line.partition(" ")
        got[int(rank)] = json.loads(cpus)
    assert got == expected
