"""Reading a user's YAML file (profile or job) as UTF-8 text: every failure is one line naming the file and
what to do, never a traceback, so profiles and job files fail the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpcring.files import read_at_most

# The largest profile or job file read: the built-in profiles are under 8 KiB. A bigger one would only make
# the parser and the validation slow (a million partitions took minutes); it is refused before it is read.
MAX_BYTES = 1 << 20


def read_text(path: Path, what: str, error: Callable[[str], Exception]) -> str:
    """The text of `path` (a `what`: "profile file", "job file"), or `error(message)` saying why not."""
    if path.is_dir():
        raise error(f"{what} {str(path)!r} is a directory, not a file")
    if not path.exists():
        raise error(f"{what} {str(path)!r} does not exist")
    try:
        data = read_at_most(path, MAX_BYTES)
    except OSError as exc:
        raise error(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    if data is None:
        raise error(f"{what} {str(path)!r} is larger than {MAX_BYTES} bytes, the most allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise error(
            f"{what} {str(path)!r} is not UTF-8 text: byte 0x{bad} at offset {exc.start}; save it as UTF-8"
        ) from exc
