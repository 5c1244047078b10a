"""How a Python rank failed, as its runner tells its wrapper: the exception (or exit) and where it was raised.

Why: an exit code says nothing about *what* failed, and the elastic driver must tell a broken script (the same
error on every rank) from a host's failure (docs/guide/elastic.md). `hpcring.launch.pyrun` writes one JSON
report to the pipe its wrapper hands it (the descriptor in HPCRING_REPORT_FD) when the user's code raises or
exits non-zero; the wrapper adds it to the exit report it sends the launcher. Nothing here imports MPI or
torch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import traceback
import types
from dataclasses import asdict, dataclass
from typing import Any

from hpcring.contracts import elastic as contract

REPORT_FD = "HPCRING_REPORT_FD"  # the wrapper's pipe, in the runner's environment only
MAX_TEXT = 8192  # a traceback longer than this (deep recursion) keeps its last part
DISK = "disk"  # ErrorReport.kind of a write that found its file system full (ENOSPC, EDQUOT)


@dataclass(frozen=True)
class ErrorReport:
    """One rank's failure: what (`summary`), where (`where`), the printed traceback, and whether the rank had
    committed elastic state first (None when nobody said)."""

    kind: str  # "exception" | "exit" | "disk" (DISK)
    summary: str  # "AttributeError: module 'x' has no attribute 'y'" | "exit code 2"
    where: str = ""  # innermost frame, 'FILE:LINE in FUNCTION'
    text: str = ""
    committed: bool | None = None

    def fingerprint(self) -> tuple[str, str, str]:
        """What makes two failures 'the same': kind, message and the line that raised."""
        return (self.kind, self.summary, self.where)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> ErrorReport | None:
        """The report a wrapper relayed; None for anything malformed (a report is a hint, never required)."""
        if not isinstance(data, dict):
            return None
        try:
            committed = data.get("committed")
            return cls(
                kind=str(data["kind"]),
                summary=str(data["summary"]),
                where=str(data.get("where", "")),
                text=str(data.get("text", "")),
                committed=committed if isinstance(committed, bool) else None,
            )
        except KeyError:
            return None

    @classmethod
    def for_exit_code(cls, code: int) -> ErrorReport:
        """A rank that exited non-zero with no report of its own (not a Python rank of hpcring's runner)."""
        return cls("exit", f"exit code {code}")


def _where(tb: types.TracebackType | None) -> str:
    if tb is None:
        return ""
    last = traceback.extract_tb(tb)[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


def _committed() -> bool:
    return os.environ.get(contract.COMMITTED) == "1"


def of_exception(exc: BaseException, tb: types.TracebackType | None) -> ErrorReport:
    """The report of an exception (tb: its traceback as printed, the launcher's frames left out). A full
    file system is its own kind, DISK: neither the script's fault nor its host's, and its one line (the
    folder, the bytes needed) says all a traceback would."""
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ErrorReport(DISK, summary, _where(tb), "", _committed())
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    if len(text) > MAX_TEXT:
        text = "...\n" + text[-MAX_TEXT:]
    return ErrorReport("exception", summary, _where(tb), text, _committed())


def of_exit(status: int, message: str | None, tb: types.TracebackType | None) -> ErrorReport:
    """The report of `sys.exit(...)` with a non-zero status (message: a string given to sys.exit)."""
    summary = message if message else f"exit code {status}"
    return ErrorReport("exit", summary, _where(tb), committed=_committed())


def take_fd() -> int | None:
    """The wrapper's report pipe, removed from the environment so the user's program never sees it."""
    value = os.environ.pop(REPORT_FD, "")
    if not value.isdigit():
        return None
    fd = int(value)
    with contextlib.suppress(OSError):
        os.set_inheritable(fd, False)
        return fd
    return None


def send(fd: int | None, report: ErrorReport) -> None:
    """Write the report (one JSON line) to the wrapper's pipe; best effort, never raises."""
    if fd is None:
        return
    with contextlib.suppress(OSError, ValueError):
        os.write(fd, json.dumps(report.to_json()).encode() + b"\n")


def receive(data: bytes) -> ErrorReport | None:
    """The last report in what the runner wrote to the pipe."""
    for line in reversed(data.splitlines()):
        with contextlib.suppress(ValueError):
            return ErrorReport.from_json(json.loads(line))
    return None


@dataclass(frozen=True)
class RankFailure:
    """A rank that failed on its own (not one the launcher ended): how, its exit status, and for a non-zero
    exit what failed (the runner's report, or just the exit code). `error` is None for a signal or a lost
    wrapper: those say nothing about the script."""

    rank: int
    how: str  # "exited with code 1", "was killed by signal 9 (SIGKILL)", ...
    status: int
    error: ErrorReport | None = None
