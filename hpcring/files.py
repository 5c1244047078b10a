"""Writing a file whole: a reader that opens it sees the old contents or the new, never half of them."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it and a rename (atomic on one file system);
    the parent folder is created when missing."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
