"""A small key-value store over TCP: the out-of-band channel a world forms through without `mpiexec`.

Processes that are not started by one `mpiexec` (Ray actors' workers) must learn rank 0's MPI port name
before they can `MPI_Comm_connect` to it. One process (the Ray driver) serves this store; every worker is a
client. `get` waits on the server until the key is set, so a worker can ask before rank 0 has published.
A random token, handed to the clients with the address, keeps strangers on the network from reading or
writing keys. The wire format is one JSON object per line, both ways. Nothing here imports MPI.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from typing import Any

from hpcring.errors import ConfigError, LaunchError

_MAX_LINE = 1 << 20


class StoreServer:
    """Serves set/get on a background thread until `close()`; one thread per client connection."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self.token = secrets.token_hex(16)
        self._data: dict[str, str] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._sock = socket.create_server((host, port), reuse_port=False)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="hpcring-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                reply = self._handle(json.loads(line))
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()

    def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("token") != self.token:
            return {"error": "bad token"}
        key = str(req.get("key"))
        if req.get("op") == "set":
            self.set(key, str(req.get("value")))
            return {"ok": True}
        if req.get("op") == "get":
            value = self.wait(key, float(req.get("timeout", 0)))
            return {"ok": value is not None, "value": value}
        return {"error": f"unknown op {req.get('op')!r}; allowed: 'set' or 'get'"}

    def set(self, key: str, value: str) -> None:
        """Set a key (from the serving process itself, or on a client's behalf) and wake its waiters."""
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def wait(self, key: str, timeout: float) -> str | None:
        """The key's value, waiting up to `timeout` seconds for it to be set; None if it never was."""
        with self._cond:
            self._cond.wait_for(lambda: key in self._data or self._closed, timeout)
            return self._data.get(key)

    def clear(self, prefix: str) -> None:
        """Forget every key under `prefix` (a world that re-forms must not read the previous one's port)."""
        with self._cond:
            for key in [k for k in self._data if k.startswith(prefix)]:
                del self._data[key]

    def close(self) -> None:
        """Stop serving; waiting clients get 'not set'."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._sock.close()


class StoreClient:
    """A connection to a `StoreServer` at `address` ('host:port') presenting its token."""

    def __init__(self, address: str, token: str, connect_timeout: float = 30.0) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"rendezvous store address {address!r} is not 'host:port'")
        self._token = token
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=connect_timeout)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise LaunchError(f"cannot reach the rendezvous store at {address}: {exc}") from exc
                time.sleep(0.1)
        self._sock.settimeout(None)
        self._stream = self._sock.makefile("rwb")

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        self._stream.write(json.dumps({**req, "token": self._token}).encode() + b"\n")
        self._stream.flush()
        line = self._stream.readline(_MAX_LINE)
        if not line:
            raise LaunchError("the rendezvous store closed the connection")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise LaunchError(f"rendezvous store refused {req.get('op')}: {reply['error']}")
        return reply

    def set(self, key: str, value: str) -> None:
        """Publish a value under `key`."""
        self._call({"op": "set", "key": key, "value": value})

    def get(self, key: str, timeout: float) -> str:
        """The value of `key`, waiting up to `timeout` seconds; LaunchError naming the key if never set."""
        reply = self._call({"op": "get", "key": key, "timeout": timeout})
        if not reply.get("ok"):
            raise LaunchError(f"rendezvous key {key!r} was not published within {timeout:g} s")
        return str(reply["value"])

    def close(self) -> None:
        """Close the connection."""
        self._stream.close()
        self._sock.close()
