"""hpcring starts MPI when the script left it unstarted, and refuses a thread level too low for its engine.

Each case is a real launch (`hpcring run`, Open MPI and MPICH) of tests/mpi/mpi_init_program.py, under a
timeout: a job that hangs fails here instead of stalling the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import RunRanks

pytestmark = pytest.mark.mpi

PROGRAM = str(Path(__file__).with_name("mpi_init_program.py"))


@pytest.mark.parametrize(
    ("flavour", "np", "api"),
    [
        ("openmpi", 1, "torch"),
        ("openmpi", 2, "torch"),
        ("openmpi", 4, "torch"),
        ("openmpi", 2, "numpy"),
        ("mpich", 2, "torch"),
        ("mpich", 4, "numpy"),
    ],
)
def test_hpcring_initialises_and_finalises_mpi(
    hpcring_run: RunRanks, flavour: str, np: int, api: str
) -> None:
    proc = hpcring_run(
        np, ["{python}", PROGRAM, "lazy", api], flavour=flavour, extra=["--no-prefix"], timeout=180
    )
    # A rank that exits with MPI still initialised makes mpiexec report an abnormal end: exit 0 shows the
    # finalisation at exit happened on every rank.
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")), key=str)
    assert sorted(r["rank"] for r in rows) == list(range(np))
    assert all(r["sum"] == np * (np + 1) / 2 for r in rows), rows
    assert "exited improperly" not in proc.stderr and "without calling" not in proc.stderr


@pytest.mark.parametrize(
    ("flavour", "np", "mode", "api"),
    [
        ("openmpi", 1, "rc-single", "torch"),
        ("openmpi", 2, "init-single", "torch"),
        ("openmpi", 4, "rc-single", "numpy"),
        ("mpich", 2, "init-single", "numpy"),
        ("mpich", 4, "rc-single", "torch"),
    ],
)
def test_too_low_thread_level_is_a_clear_error_on_every_rank(
    hpcring_run: RunRanks, flavour: str, np: int, mode: str, api: str
) -> None:
    proc = hpcring_run(
        np, ["{python}", PROGRAM, mode, api], flavour=flavour, extra=["--no-prefix"], timeout=180
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    raised = [line for line in proc.stdout.splitlines() if " init raised " in line]
    assert sorted(int(line.split()[1]) for line in raised) == list(range(np)), proc.stdout + proc.stderr
    for line in raised:
        assert "ConfigError: MPI was initialised with MPI_THREAD_SINGLE" in line
        assert "hpcring needs MPI_THREAD_MULTIPLE" in line and "MPI.Init_thread(MPI.THREAD_MULTIPLE)" in line
