"""mpiexec's own output, relayed line by line by `hpcring run`'s supervisor (supervisor.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import BinaryIO


class MpiOutput:
    """mpiexec's own output, relayed line by line.

    Open MPI's "exited improperly" help block is dropped when we are ending the job ourselves: we ended those
    processes, and the launcher already named the cause. It can arrive just before the failing rank's report,
    so such a block is held back briefly before it is shown."""

    NOISE = ("improperly", "exited due to process rank", "noticed that process rank", "BAD TERMINATION")
    # MPICH's lines after its "BAD TERMINATION" box
    NOISE_LINES = (
        b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING",
        b"This typically refers to a problem with your application.",
        b"Please see the FAQ page for debugging suggestions",
    )
    HOLD_S = 3.0

    def __init__(self, stream: BinaryIO, aborting: Callable[[], bool]) -> None:
        self.stream = stream
        self.aborting = aborting
        self.partial = b""
        self.block: list[bytes] | None = None
        self.held: list[tuple[float, list[bytes]]] = []

    def feed(self, data: bytes, final: bool = False) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        out: list[bytes] = []
        for line in lines:
            ruler = len(line) > 20 and len(set(line.strip())) == 1 and line.strip()[:1] in (b"-", b"=")
            if self.block is None and ruler:
                self.block = [line]
            elif self.block is None and line.startswith(self.NOISE_LINES):
                self._hold([line])
            elif self.block is not None:
                self.block.append(line)
                if ruler:
                    out += self._close_block()
            else:
                out.append(line)
        if final and self.block is not None:
            out += self.block
            self.block = None
        self._write(out)
        self.tick(final)

    def tick(self, final: bool = False) -> None:
        """Drop held blocks once the job is aborting; show them when their hold expires or at the end."""
        if self.aborting():
            self.held.clear()
        now = time.monotonic()
        while self.held and (final or self.held[0][0] <= now):
            self._write(self.held.pop(0)[1])

    def _write(self, lines: list[bytes]) -> None:
        if lines:
            self.stream.write(b"".join(line + b"\n" for line in lines))
            self.stream.flush()

    def _close_block(self) -> list[bytes]:
        block, self.block = self.block or [], None
        text = b" ".join(block).decode(errors="replace")
        if any(n in text for n in self.NOISE):
            self._hold(block)
            return []
        return block

    def _hold(self, lines: list[bytes]) -> None:
        if not self.aborting():
            self.held.append((time.monotonic() + self.HOLD_S, lines))
