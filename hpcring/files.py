"""Writing files with every byte checked: a full disk is an error naming the folder and the bytes needed,
never a SIGBUS (nothing here maps a file) or a silently short file.

`write_whole` replaces a file atomically (a reader sees the old contents or the new, never half of them);
`reserve` and `write_at` let a caller overwrite a file it keeps in place (the elastic commit store)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

from hpcring.errors import DiskFullError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def read_at_most(path: str | Path, limit: int) -> bytes | None:
    """The bytes of `path`, or None when it holds more than `limit`: a loader reads no more than it accepts
    (OSError when it cannot be read)."""
    with Path(path).open("rb") as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


def free_bytes(directory: str | Path) -> int | None:
    """Bytes an unprivileged writer can still use in `directory`'s file system (None: cannot tell)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(exc: OSError, what: str, directory: str | Path, needed: int) -> OSError:
    """The error to raise for `exc`: a DiskFullError when the file system is full, else `exc` itself."""
    if exc.errno not in _FULL:
        return exc
    return DiskFullError(what, str(directory), needed, free_bytes(directory), exc.errno)


def reserve(fd: int, size: int) -> None:
    """Give the open file `size` bytes backed by the file system now (ENOSPC here, not at a later write).
    File systems that cannot preallocate (EOPNOTSUPP, EINVAL) are only resized: the writes still check."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    os.ftruncate(fd, size)  # a file kept from a larger layout shrinks


def write_at(fd: int, data: Any, offset: int) -> None:
    """Write all of `data` (any buffer) at `offset`, repeating short writes; a write of 0 bytes is ENOSPC."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


def write_whole(path: str | Path, data: bytes, what: str = "a file") -> None:
    """Write `data` to `path` through a temporary file beside it, fsync and a rename (atomic on one file
    system); the parent folder is created when missing. On any failure the temporary file is removed and
    the old `path` stays; a full disk raises DiskFullError."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            reserve(fd, len(data))
            write_at(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        err = disk_full(exc, what, target.parent, len(data))
        if err is exc:
            raise
        raise err from exc
