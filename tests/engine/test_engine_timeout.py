"""The collective timeout in real jobs: one rank freezes itself (a real SIGSTOP) inside a collective, and
every other rank ends within the timeout plus a margin, naming the operation, the tensor and the frozen rank
with its host; `hpcring run` exits with the timeout's status. Open MPI and MPICH, 2 and 4 ranks.
(tests/ranked/engine/timeout_program.py is the job; tests/engine/test_watchdog_units.py the bookkeeping.)"""

from __future__ import annotations

import re
import socket
import time

import pytest
from support import RunRanks

from hpcring.engine.watchdog import GRACE_S, HANDOFF_S, poll_interval, roll_call_window
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS

PROGRAM = "tests/ranked/engine/timeout_program.py"
TIMEOUT_S = 3.0
FROZEN = 1
# From the freeze to `hpcring run` returning: the timeout, the watchdog's poll and grace, the launcher ending
# the frozen rank (SIGTERM, then SIGKILL after its grace) and slack for 2 loaded cores.
MARGIN_S = 25.0


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
def test_frozen_rank_ends_the_job(hpcring_run: RunRanks, flavour: str, np: int, mode: str) -> None:
    # The flag for MPICH, its environment twin for Open MPI: both reach the ranks.
    by_flag = flavour == "mpich"
    proc = hpcring_run(
        np,
        ["{python}", PROGRAM, mode],
        flavour=flavour,
        extra=["--collective-timeout", f"{TIMEOUT_S:g}"] if by_flag else [],
        env={} if by_flag else {"HPCRING_COLLECTIVE_TIMEOUT": f"{TIMEOUT_S:g}"},
        timeout=150,
    )
    ended = time.time()
    out = proc.stdout + proc.stderr
    assert proc.returncode == COLLECTIVE_TIMEOUT_EXIT_STATUS, out[-6000:]
    frozen = re.search(rf"^\[{FROZEN}\]<stdout>:FROZEN (\d+\.\d+) (.*)$", proc.stdout, re.M)
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
            if line.startswith(f"[{r}]<stderr>:hpcring: collective timeout on rank {r} ")
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
    assert f"exited with code {COLLECTIVE_TIMEOUT_EXIT_STATUS}" in proc.stderr, out[-6000:]
