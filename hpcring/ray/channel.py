"""Messages between a Ray actor and the MPI worker process it started: pickled objects over a local socket.

The actor cannot be the MPI process itself (Ray starts actors; a world needs processes started as MPI jobs,
see `hpcring.launch.rendezvous`), so each actor runs one worker process and relays calls to it. Functions
travel pickled by value with cloudpickle (lambdas, closures and functions of `__main__` alike), results
come back the same way. A message is an 8-byte big-endian length followed by the pickle.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

from hpcring import _deps

_LENGTH = struct.Struct(">Q")


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
