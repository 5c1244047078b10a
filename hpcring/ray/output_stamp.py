"""Horovod's `prefix_output_with_timestamp` for ranks whose output no launcher forwards (Spark workers).

`hpcring run` stamps each forwarded line in its supervisor; `hpcring.spark.run`'s ranks write straight to
their executor's output, so there the worker stamps its own lines instead, in the launcher's format
(`<time>[<rank>]<stdout>:line`). What Python writes through `sys.stdout`/`sys.stderr` is stamped; output
written by C code to the file descriptors directly is not.
"""

from __future__ import annotations

import io
import os
import sys
import time
from typing import Any, TextIO

VARIABLE = "HPCRING_OUTPUT_TIMESTAMP"


class StampedStream(io.TextIOBase):
    """A text stream that prefixes every line it passes on with the time, the rank and the stream's name."""

    def __init__(self, inner: TextIO, rank: str, name: str) -> None:
        super().__init__()
        self._inner = inner
        self._tag = f"[{rank}]<{name}>:"
        self._at_line_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                out.append(time.strftime("%a %b %d %H:%M:%S %Y") + self._tag)
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._inner.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def fileno(self) -> int:
        return self._inner.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install_from_env(rank: int) -> bool:
    """Stamp this process's sys.stdout and sys.stderr when HPCRING_OUTPUT_TIMESTAMP is 1; whether it did."""
    if os.environ.get(VARIABLE) != "1" or isinstance(sys.stdout, StampedStream):
        return False
    sys.stdout = StampedStream(sys.stdout, str(rank), "stdout")  # type: ignore[assignment]
    sys.stderr = StampedStream(sys.stderr, str(rank), "stderr")  # type: ignore[assignment]
    return True
