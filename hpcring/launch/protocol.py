"""Control-socket framing between `hpcring run` and its per-rank wrappers, and what a frame may hold.

A frame is one type byte, a 4-byte big-endian length and the payload. TCP (not the MPI job's stdio) carries
the ranks' output and exit reports, so the launcher sees every rank's output as whole lines, learns exactly
how each rank ended, and can tell survivors to stop; TCP also works when ranks run on other hosts.

Anyone who can reach the port can send bytes (issue 35), so a connection proves it holds the job's token
before anything else is read: the launcher's first frame is a random nonce, the wrapper's first frame the
HMAC-SHA256 of it under the token (the token itself never travels). Until then at most one fixed-size frame
is read; afterwards frames are size-capped, JSON is depth- and size-checked before it is parsed, and every
field is type-checked (`hello`, `exited`), so no input raises anything but `ProtocolError`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

# launcher -> wrapper, first: NONCE_BYTES random bytes
CHALLENGE = b"C"
# wrapper -> launcher, first: the MAC of the challenge (mac())
AUTH = b"A"
# wrapper -> launcher
HELLO = b"H"  # json: rank, size, host, pid
STARTED = b"S"  # json: pid of the user command
STDOUT = b"O"  # raw bytes
STDERR = b"E"  # raw bytes
EXITED = b"X"  # json: code, signal, ended_by_launcher, error (report.py), reason (str, optional)
SHM = b"M"  # json: paths (shared-memory files the rank maps; cleanup.py)
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
HEADER_BYTES = _HEADER.size
NONCE_BYTES = 32
MAC_BYTES = 32
AUTH_FRAME_BYTES = HEADER_BYTES + MAC_BYTES
# An authenticated wrapper sends output in reads of at most 64 KiB; a launcher's GO carries the environment.
MAX_FRAME = 16 << 20
MAX_JSON = 4 << 20
MAX_DEPTH = 8  # deepest nesting of any message (an exit report's error dict is depth 2)
_MAC_CONTEXT = b"hpcring-control-v1\0"


class ProtocolError(ValueError):
    """A peer sent something this protocol does not allow; the connection is dropped, nothing else."""


def frame(kind: bytes, payload: bytes) -> bytes:
    """Encode one frame."""
    return _HEADER.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, obj: Any) -> bytes:
    """Encode one frame whose payload is JSON."""
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def send_json(sock: socket.socket, kind: bytes, obj: Any) -> None:
    """Send a JSON frame completely (blocking)."""
    sock.sendall(json_frame(kind, obj))


def mac(token: str, nonce: bytes) -> bytes:
    """What proves the job's token on a connection: HMAC-SHA256 of the launcher's nonce under the token."""
    return hmac.new(token.encode(), _MAC_CONTEXT + nonce, hashlib.sha256).digest()


def check_auth(data: bytes, token: str, nonce: bytes) -> None:
    """`data` is exactly an AUTH frame carrying mac(token, nonce) (compared in constant time), else raise."""
    kind, length = _HEADER.unpack_from(data)
    if kind != AUTH or length != MAC_BYTES or len(data) != AUTH_FRAME_BYTES:
        raise ProtocolError(f"first frame is not an authentication ({kind!r}, {length} bytes)")
    if not hmac.compare_digest(data[HEADER_BYTES:], mac(token, nonce)):
        raise ProtocolError("wrong job token (MAC mismatch)")


class FrameReader:
    """Accumulates received bytes and yields complete frames; a length over `limit` is a protocol error."""

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Add bytes; yield each (kind, payload) that is now complete."""
        self._buf += data
        while len(self._buf) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self._buf)
            if length > self.limit:
                raise ProtocolError(f"control frame of {length} bytes exceeds {self.limit}")
            end = _HEADER.size + length
            if len(self._buf) < end:
                return
            payload = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            yield kind, payload


def _depth(payload: bytes) -> int:
    """Deepest bracket nesting of JSON text, strings skipped: checked before json.loads, whose recursion a
    deep payload would otherwise exhaust."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def decode(payload: bytes) -> dict[str, Any]:
    """A JSON object from a frame, refused (ProtocolError) when too large, too deep or not an object."""
    if len(payload) > MAX_JSON:
        raise ProtocolError(f"JSON message of {len(payload)} bytes exceeds {MAX_JSON}")
    if _depth(payload) > MAX_DEPTH:
        raise ProtocolError(f"JSON message nested deeper than {MAX_DEPTH}")
    try:
        obj = json.loads(payload.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed JSON message: {str(exc)[:100]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"JSON message is a {type(obj).__name__}, not an object")
    return obj


def _field(obj: dict[str, Any], name: str, types: tuple[type, ...], required: bool = True) -> Any:
    """obj[name] when it has one of `types` (bool is not an int here), else ProtocolError."""
    if name not in obj:
        if required:
            raise ProtocolError(f"message lacks field {name!r}")
        return None
    value = obj[name]
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        allowed = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ProtocolError(f"field {name!r} is {type(value).__name__}, expected {allowed}")
    return value


def hello(payload: bytes) -> dict[str, Any]:
    """A wrapper's HELLO: rank (int), size (int), host (str, at most 255), pid (int)."""
    obj = decode(payload)
    out = {
        "rank": _field(obj, "rank", (int,)),
        "size": _field(obj, "size", (int,)),
        "host": _field(obj, "host", (str,)),
        "pid": _field(obj, "pid", (int,), required=False),
    }
    if len(out["host"]) > 255:
        raise ProtocolError("field 'host' longer than 255 characters")
    return out


def exited(payload: bytes) -> dict[str, Any]:
    """A wrapper's EXITED report: code and signal (int or null), ended_by_launcher (bool), error (object,
    optional: report.ErrorReport checks it), reason (str, optional)."""
    obj = decode(payload)
    return {
        "code": _field(obj, "code", (int, type(None))),
        "signal": _field(obj, "signal", (int, type(None))),
        "ended_by_launcher": bool(_field(obj, "ended_by_launcher", (bool,), required=False)),
        "error": _field(obj, "error", (dict, type(None)), required=False),
        "reason": _field(obj, "reason", (str, type(None)), required=False),
    }


def started(payload: bytes) -> dict[str, Any]:
    """A wrapper's STARTED: pid (int)."""
    return {"pid": _field(decode(payload), "pid", (int,))}


MAX_PATHS = 64


def shm_paths(payload: bytes) -> list[str]:
    """A wrapper's SHM report: paths, at most MAX_PATHS absolute paths of at most 4096 characters each."""
    paths = _field(decode(payload), "paths", (list,))
    if len(paths) > MAX_PATHS or not all(
        isinstance(p, str) and p.startswith("/") and len(p) <= 4096 for p in paths
    ):
        raise ProtocolError(f"field 'paths' must be at most {MAX_PATHS} absolute paths")
    return list(paths)
