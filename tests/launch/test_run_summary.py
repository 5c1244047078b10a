"""`hpcring run` ends a successful job with one line: ranks, wall time, and the slowest rank when one lags.

The lag is real here: one rank of the launched job sleeps longer than the others.
"""

from __future__ import annotations

import socket

import pytest
from test_run import run_cli

from hpcring.launch.run_summary import summary

LAGGARD = "import os, time; time.sleep(0.2 + (1.0 if os.environ['HPCRING_RANK'] == '{rank}' else 0.0))"


def _summary_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " finished in " in line]


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 4])
def test_the_slow_rank_is_named_with_its_host(np: int) -> None:
    slow = np - 1
    res = run_cli("-np", str(np), "--", "python", "-c", LAGGARD.format(rank=slow))
    assert res.returncode == 0, res.stderr
    (line,) = _summary_lines(res.stderr)
    assert line.startswith(f"hpcring run: {np} ranks finished in ")
    assert f"slowest rank {slow} on {socket.gethostname()}: " in line, line


@pytest.mark.mpi
def test_no_straggler_no_quiet_no_failure() -> None:
    even = run_cli("-np", "2", "--", "true")
    assert even.returncode == 0, even.stderr
    (line,) = _summary_lines(even.stderr)
    assert line.startswith("hpcring run: 2 ranks finished in ") and "slowest" not in line
    quiet = run_cli("-np", "2", "--quiet", "--", "true")
    assert quiet.returncode == 0 and not _summary_lines(quiet.stderr)
    failed = run_cli("-np", "2", "--", "false")
    assert failed.returncode != 0 and not _summary_lines(failed.stderr)


@pytest.mark.parametrize(
    ("times", "named"),
    [
        ({0: ("a", 10.0), 1: ("b", 10.4)}, None),  # 4 % over the median: noise
        ({0: ("a", 10.0), 1: ("b", 10.0), 2: ("c", 11.0)}, "slowest rank 2 on c: 11.0 s, 10 % over"),
        ({0: ("a", 0.10), 1: ("b", 0.18)}, None),  # 29 % but 0.04 s over the median of a tiny job
        ({0: ("a", 1.0)}, None),  # one rank: nobody to lag behind
    ],
)
def test_straggler_threshold(times: dict[int, tuple[str, float]], named: str | None) -> None:
    line = summary(len(times), 12.0, times)
    assert line.startswith(f"hpcring run: {len(times)} rank")
    assert (named in line) if named else ("slowest" not in line)
