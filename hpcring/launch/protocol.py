"""Control-socket framing between `hpcring run` and its per-rank wrappers.

A frame is one type byte, a 4-byte big-endian length and the payload. TCP (not the MPI job's stdio) carries
the ranks' output and exit reports, so the launcher sees every rank's output as whole lines, learns exactly
how each rank ended, and can tell survivors to stop; TCP also works when ranks run on other hosts.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

# wrapper -> launcher
HELLO = b"H"  # json: rank, size, host, pid, token
STARTED = b"S"  # json: pid of the user command
STDOUT = b"O"  # raw bytes
STDERR = b"E"  # raw bytes
EXITED = b"X"  # json: code, signal, ended_by_launcher, error (report.py), reason (str, optional)
# both ways: "still here" (any frame counts as a sign of life; liveness.py)
HEARTBEAT = b"B"
# launcher -> wrapper
GO = b"G"  # json: override (env to set), defaults (env to set when absent)
TERMINATE = b"T"  # json: reason
NOTIFY = b"N"  # json: path, notice (elastic host update: the wrapper writes it to its node's file)
SIGNAL = b"U"  # json: signal (a wall-clock warning the launcher received: the wrapper passes it to the rank)

# The job's secret reaches the wrappers in their environment, never on a command line (`ps` shows those to
# every user of a node); the MPI launchers forward it by name (Open MPI `-x NAME`; hydra forwards its whole
# environment).
TOKEN_VARIABLE = "HPCRING_JOB_TOKEN"

_HEADER = struct.Struct(">cI")
MAX_FRAME = 64 << 20


def frame(kind: bytes, payload: bytes) -> bytes:
    """Encode one frame."""
    return _HEADER.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, obj: Any) -> bytes:
    """Encode one frame whose payload is JSON."""
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def send_json(sock: socket.socket, kind: bytes, obj: Any) -> None:
    """Send a JSON frame completely (blocking)."""
    sock.sendall(json_frame(kind, obj))


class FrameReader:
    """Accumulates received bytes and yields complete frames; a corrupt length is a protocol error."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Add bytes; yield each (kind, payload) that is now complete."""
        self._buf += data
        while len(self._buf) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise ValueError(f"control frame of {length} bytes exceeds {MAX_FRAME}")
            end = _HEADER.size + length
            if len(self._buf) < end:
                return
            payload = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            yield kind, payload


def decode(payload: bytes) -> Any:
    """Decode a JSON payload."""
    return json.loads(payload.decode())
