"""One exception hierarchy for everything hpcring raises at a user.

Every message says what was wrong and what is allowed, so a user can fix the input without reading our code.
`CollectiveError` subclasses `RuntimeError` because Horovod's `HorovodInternalError` does, and user code
written for Horovod catches `RuntimeError` around collectives.
"""

from __future__ import annotations

from collections.abc import Iterable

SHOWN_CHARS = 200  # the most of a value an error message quotes


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, at most about `limit` characters: a hostile value (a megabyte
    string, an expanded YAML structure) is cut, and a long container is never rendered whole first."""
    import reprlib

    bounded = reprlib.Repr()
    bounded.maxlevel, bounded.maxstring, bounded.maxother, bounded.maxlong = 3, limit, limit, limit
    bounded.maxlist = bounded.maxtuple = bounded.maxdict = bounded.maxset = 20
    text = bounded.repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def shown_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """A message from elsewhere (jsonschema's, which quotes whole values) cut to about `limit` characters."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class HpcringError(Exception):
    """Base of every error hpcring raises on purpose."""


class ConfigError(HpcringError, ValueError):
    """A setting (environment variable, CLI flag, keyword) has a value we do not accept."""


class BackendUnavailable(HpcringError, ImportError):
    """An optional dependency (mpi4py, torch, NCCL, ...) is needed for what was asked and is missing."""

    def __init__(self, what: str, install: str, detail: str = "") -> None:
        msg = f"{what} is not available{': ' + detail if detail else ''}. Install it with: {install}"
        super().__init__(msg)
        self.what = what
        self.install = install


class NotInitializedError(HpcringError, ValueError):
    """A collective was called before `hpcring.init()` (Horovod raises ValueError here too)."""


class CollectiveError(HpcringError, RuntimeError):
    """A collective failed or its inputs disagree across ranks; raised on every participating rank."""


# The status a rank exits with when a collective outlived HPCRING_COLLECTIVE_TIMEOUT (engine/watchdog.py):
# EX_SOFTWARE, distinct from an uncaught exception's 1, so `hpcring run` and scripts can tell the two apart.
COLLECTIVE_TIMEOUT_EXIT_STATUS = 70


class CollectiveTimeoutError(CollectiveError):
    """A collective every rank submitted did not complete within HPCRING_COLLECTIVE_TIMEOUT; the watchdog
    fails the pending requests with it and then ends the process (`exit_status`), since MPI cannot recover.
    A CollectiveError, so elastic code catching HorovodInternalError catches it too."""

    exit_status = COLLECTIVE_TIMEOUT_EXIT_STATUS


# The status a rank exits with when a file it must write does not fit (`DiskFullError`): EX_IOERR.
DISK_FULL_EXIT_STATUS = 74


class DiskFullError(HpcringError, OSError):
    """A file hpcring writes (an elastic commit, a checkpoint) does not fit on its file system: the disk's
    fault, never a host's or the script's, so the elastic driver ends the job and blacklists nobody.
    One line naming the folder and the bytes needed; `errno` is ENOSPC (or EDQUOT) as the write's was."""

    exit_status = DISK_FULL_EXIT_STATUS

    def __init__(self, what: str, directory: str, needed: int, free: int | None, errno_: int) -> None:
        room = f"{free} bytes are free there" if free is not None else "the free space is unknown"
        super().__init__(
            f"no space left for {what} in {directory}: it needs {needed} bytes and {room}; free some space "
            "there or point it at a larger file system"
        )
        self.errno = errno_
        self.directory = directory
        self.needed = needed


class ArgumentError(HpcringError, TypeError, ValueError):
    """A collective was given something it does not take (not a tensor, a sparse tensor where dense ones
    go); the message names the argument and what it takes. A TypeError, and a ValueError as the checks of
    earlier versions raised."""


class RankFailedError(HpcringError, RuntimeError):
    """Another rank died or raised; carries its number so every survivor can report it."""

    def __init__(self, rank: int, how: str) -> None:
        super().__init__(f"rank {rank} failed: {how}")
        self.rank = rank
        self.how = how


class LaunchError(HpcringError):
    """`hpcring run` could not start the job as asked."""


class ProfileError(HpcringError, ValueError):
    """A cluster profile is invalid; the message names the YAML path, the bad value and the allowed values."""


class JobShapeError(HpcringError, ValueError):
    """The requested job cannot be placed on the profile's nodes; the message says why."""


class SubmitError(HpcringError):
    """The scheduler refused or failed a submission."""


def choices(values: Iterable[object]) -> str:
    """Format allowed values for an error message: `'a', 'b' or 'c'`."""
    items = [shown(v) for v in values]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]
