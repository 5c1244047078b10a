"""What every scheduler's submit and wait code shares: the ended job's result and running a scheduler command
with a clear error when it is missing or hangs."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
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


# Called at each change of a waited-for job's phase: (the job as named, the new phase's text, seconds in the
# previous phase).
OnChange = Callable[[str, str, float], None]


def poll_until_end(
    query: Callable[[], JobResult | Active | None],
    what: str,
    poll: float,
    timeout: float | None,
    on_change: OnChange | None = None,
) -> JobResult:
    """Ask `query` every `poll` seconds until it gives the job's result; None means no answer this time."""
    start = since = time.monotonic()
    shown = ""
    while True:
        result = query()
        now = time.monotonic()
        text = result.state if isinstance(result, JobResult) else _phase_text(result) if result else shown
        if on_change is not None and text != shown:
            on_change(what, text, now - since)
            shown, since = text, now
        if isinstance(result, JobResult):
            return result
        if timeout is not None and now - start > timeout:
            raise SubmitError(f"{what} still running after {timeout:.0f} s (it was left running)")
        time.sleep(poll)


def _phase_text(state: Active) -> str:
    """`running`, or `pending (PD)` where the scheduler's own word differs from the phase's name."""
    return state.phase if state.word.lower() == state.phase else f"{state.phase} ({state.word})"
