"""Messages between a Ray actor and the MPI worker process it started: pickled objects over a local socket.

The actor cannot be the MPI process itself (Ray starts actors; a world needs processes started as MPI jobs,
see `hpcring.launch.rendezvous`), so each actor runs one worker process and relays calls to it. Functions
travel pickled by value with cloudpickle (lambdas, closures and functions of `__main__` alike), results
come back the same way. A message is an 8-byte big-endian length followed by the pickle.

Unpickling runs code, so nothing is unpickled from a connection before it has presented the worker's token:
the actor makes one per worker process and hands it over in the environment (never argv, which `ps` shows to
every user); a stranger who races the worker to the actor's port is dropped unread.
"""

from __future__ import annotations

import hmac
import pickle
import socket
import struct
from typing import Any

from hpcring import _deps

_LENGTH = struct.Struct(">Q")
TOKEN_VARIABLE = "HPCRING_RAY_CHANNEL_TOKEN"


def present(sock: socket.socket, token: str) -> None:
    """The worker's first bytes on a new channel: its token (before any pickle either way)."""
    sock.sendall(token.encode())


def admit(sock: socket.socket, token: str, timeout: float = 10.0) -> bool:
    """True when the peer's first bytes are `token`; read with a timeout, compared in constant time."""
    sock.settimeout(timeout)
    try:
        got = _read_exactly(sock, len(token.encode()))
    except (EOFError, OSError):
        return False
    finally:
        sock.settimeout(None)
    return hmac.compare_digest(got, token.encode())


def dumps(obj: Any) -> bytes:
    """Pickle with cloudpickle, which also carries functions that cannot be imported by name."""
    cloudpickle = _deps.require("cloudpickle")
    data: bytes = cloudpickle.dumps(obj)
    return data


def send(sock: socket.socket, obj: Any) -> None:
    """Send one message (blocking)."""
    data = dumps(obj)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError("the other end of the worker channel closed")
        chunks += chunk
    return bytes(chunks)


def recv(sock: socket.socket) -> Any:
    """Receive one message; EOFError when the peer has gone."""
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    return pickle.loads(_read_exactly(sock, length))
