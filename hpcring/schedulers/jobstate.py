"""What every scheduler's submit and wait code shares: the ended job's result and running a scheduler command
with a clear error when it is missing or hangs."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from hpcring.errors import SubmitError


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: str
    exit_code: int


@dataclass(frozen=True)
class Active:
    """A job that has not ended: the scheduler's own word for its state, and which phase that is (`pending`,
    `running`, `suspended`), so that `submit --wait` can say when a job starts whatever the scheduler."""

    word: str
    phase: str


def active(word: str, phases: dict[str, str]) -> Active:
    """`word` with its phase from a scheduler's table; a word the table lacks counts as running, the safe side
    for a job the scheduler still lists."""
    return Active(word, phases.get(word, "running"))


def run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise SubmitError(f"{argv[0]} not found on PATH: is this a {argv[0]} login node?") from exc
    except subprocess.TimeoutExpired as exc:
        raise SubmitError(f"{argv[0]} did not answer within {timeout:.0f} s") from exc
