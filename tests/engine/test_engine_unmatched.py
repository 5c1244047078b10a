"""The collective timeout for requests that not every rank submits, in real jobs under `hpcring run`: a rank
stuck in its own Python code (a deadlock) while the others wait in `step`, ranks that submit different names,
or different ops of one tensor, and a rank that leaves with `os._exit(0)`. Every rank ends with one error that
says which ranks submitted what and which did not, with their hosts; the leaver is named by the launcher.
tests/ranked/engine/unmatched_program.py is the job; tests/engine/test_unmatched_units.py the wording."""

from __future__ import annotations

import re
import socket

import pytest
from support import RunRanks

from hpcring.engine.watchdog import GRACE_S, HANDOFF_S
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS

PROGRAM = "tests/ranked/engine/unmatched_program.py"
TIMEOUT_S = 3.0
# The set's rank 0 looks at the table once a second, and a cached request reaches the table after half the
# timeout (scanned a few times per half): how late past the timeout the error may say it fired.
LATE_S = 2.5


def _listing(ranks: list[int], host: str) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} " + ", ".join(f"{r} (host {host})" for r in ranks)


def _errors(stderr: str, r: int) -> list[str]:
    prefix = f"[{r}]<stderr>:hpcring: collective timeout on rank {r} "
    return [line.split(":", 1)[1] for line in stderr.splitlines() if line.startswith(prefix)]


def _launch(
    hpcring_run: RunRanks, np: int, mode: str, flavour: str, env: dict[str, str] | None = None
) -> str:
    proc = hpcring_run(
        np,
        ["{python}", PROGRAM, mode],
        flavour=flavour,
        extra=["--collective-timeout", f"{TIMEOUT_S:g}"],
        env=env or {},
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124, 137), out[-6000:]  # ended, and not by the test's timeout
    assert "SURVIVED" not in proc.stdout, out[-6000:]
    assert all(f"READY rank {r}" in proc.stdout for r in range(np)), out[-6000:]
    return proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize(("flavour", "np"), [("openmpi", 2), ("mpich", 4)])
def test_a_rank_that_never_submits_is_named(hpcring_run: RunRanks, flavour: str, np: int) -> None:
    stuck = np - 1
    env = {"HPCRING_STALL_CHECK_TIME_SECONDS": "1"}
    stderr = _launch(hpcring_run, np, "absent", flavour, env)
    host = socket.gethostname()
    # The stall inspector still warns first, as it did (its own wording, rank 0 only).
    warning = stderr.find("submitted by ranks")
    assert 0 <= warning < stderr.find("hpcring: collective timeout"), stderr[-6000:]
    for r in range(np):
        errors = _errors(stderr, r)
        assert len(errors) == 1, stderr[-6000:]
        error = errors[0]
        assert f"on rank {r} (host {host}):" in error
        submitted = _listing(list(range(np - 1)), host)
        assert "allreduce 'allreduce.step' (waiting " in error, error
        assert f"submitted by {submitted}, not by {_listing([stuck], host)}." in error, error
        assert f"Rank {stuck} (host {host}) submitted none of these" in error, error
        assert ("This rank submitted none of them." in error) == (r == stuck), error
        assert f"HPCRING_COLLECTIVE_TIMEOUT={TIMEOUT_S:g}" in error
        assert f"exit status {COLLECTIVE_TIMEOUT_EXIT_STATUS}" in error
        waited = re.search(r"\(waiting (\d+\.\d) s\)", error)
        assert waited and TIMEOUT_S <= float(waited.group(1)) <= TIMEOUT_S + LATE_S, error
    # The ranks that waited raise it to Python (the stuck one cannot: its engine ends it after the grace).
    assert stderr.count("CollectiveTimeoutError: hpcring: collective timeout") >= 1, stderr[-6000:]
    assert GRACE_S + HANDOFF_S < TIMEOUT_S + LATE_S  # the stuck rank's end is within the job's bound


@pytest.mark.mpi
@pytest.mark.parametrize(("mode", "np"), [("names", 4), ("ops", 2)])
def test_mismatched_names_and_ops_are_named(hpcring_run: RunRanks, mode: str, np: int) -> None:
    stderr = _launch(hpcring_run, np, mode, "openmpi")
    host = socket.gethostname()
    even = [r for r in range(np) if r % 2 == 0]
    odd = [r for r in range(np) if r % 2]
    if mode == "names":
        expected = [("allreduce", "allreduce.even", even, odd), ("allreduce", "allreduce.odd", odd, even)]
    else:
        expected = [("allgather", "allgather.grad", odd, even), ("allreduce", "allreduce.grad", even, odd)]
    for r in range(np):
        errors = _errors(stderr, r)
        assert len(errors) == 1, stderr[-6000:]
        for op, name, have, missing in expected:
            part = (
                f"{op} '{name}' \\(waiting \\d+\\.\\d s\\) submitted by {re.escape(_listing(have, host))}, "
            )
            part += f"not by {re.escape(_listing(missing, host))}"
            assert re.search(part, errors[0]), errors[0]
        assert "Every rank submitted some of these: the ranks disagree on names or op types" in errors[0]


@pytest.mark.mpi
@pytest.mark.parametrize(("flavour", "np"), [("openmpi", 4), ("mpich", 2)])
def test_a_rank_that_exits_0_is_named_as_the_one_that_left(
    hpcring_run: RunRanks, flavour: str, np: int
) -> None:
    stderr = _launch(hpcring_run, np, "exit0", flavour)
    host = socket.gethostname()
    leaver = np - 1
    others = list(range(np - 1))
    word = "rank" if len(others) == 1 else "ranks"
    said = (
        f"hpcring run: rank {leaver} (host {host}) left the job: it exited with code 0 while {word} "
        f"{', '.join(map(str, others))} still ran"
    )
    assert said in stderr, stderr[-6000:]
    ended = re.search(
        rf"^hpcring run: rank (\d+) .*, after rank {leaver} left; ending the other ranks$", stderr, re.M
    )
    assert ended and int(ended.group(1)) in others, stderr[-6000:]
