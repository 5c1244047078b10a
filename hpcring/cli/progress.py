"""What a person at a terminal sees while a command waits: one line per change, nothing when piped or quiet.

Lines rather than a redrawn bar: a job's phases change a few times over minutes to days, and a scrolled record
of when each began is what a person reads back later (terminal detection is the stream's own `isatty`).
"""

from __future__ import annotations

from typing import TextIO

from hpcring.durations import duration
from hpcring.schedulers.jobstate import OnChange


def state_printer(stream: TextIO, quiet: bool) -> OnChange | None:
    """A `submission.wait` callback that prints each phase change to `stream`, or None when `stream` is not a
    terminal or `quiet` is set (scripts that read stderr get only the final line, as before)."""
    if quiet or not stream.isatty():
        return None
    previous = ""

    def show(what: str, text: str, seconds: float) -> None:
        nonlocal previous
        after = f" after {duration(seconds)} {previous}" if previous else ""
        print(f"hpcring submit: {what} {text}{after}", file=stream, flush=True)
        previous = text

    return show
