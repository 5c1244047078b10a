"""The launcher's door: where the control socket listens, and what a connection must do to be let in.

Anyone who can reach the port may connect (issue 35), so nothing from a connection is parsed before it has
proved the job's token (`protocol.check_auth`): a new connection gets a fresh nonce and must answer with one
fixed-size frame within `AUTH_TIMEOUT_S`. Until then it costs at most that frame's bytes; at most
`PENDING_LIMIT` such connections are held (the oldest is dropped for a new one, so a flood cannot keep a rank
out, and file descriptors stay bounded whatever `ulimit -n` is). Refusals are logged, at most one line per
`LOG_EVERY_S` with a count of those not shown, so a flood cannot fill the job's stderr either.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hpcring.launch import protocol

AUTH_TIMEOUT_S = 10.0  # a wrapper answers in milliseconds; this allows for a loaded node
PENDING_LIMIT = 64
LOG_EVERY_S = 1.0


@dataclass
class Pending:
    """A connection that has not yet proved the token."""

    sock: socket.socket
    peer: str
    nonce: bytes
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


class Gate:
    """Accepts connections, challenges them and decides; the supervisor registers what `accept` returns and
    hands it the bytes that arrive."""

    def __init__(self, token: str, note: Callable[[str], None]) -> None:
        self.token = token
        self.note = note
        self.pending: dict[int, Pending] = {}  # by fd, oldest first
        self._log_at = 0.0
        self._unlogged = 0

    def refuse(self, peer: str, why: str) -> None:
        """One line per refusal, rate-limited (a flood would otherwise fill the job's stderr)."""
        now = time.monotonic()
        if now < self._log_at:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since)" if self._unlogged else ""
        self.note(f"dropped a control connection from {peer}: {why}{more}")
        self._log_at, self._unlogged = now + LOG_EVERY_S, 0

    def accept(self, server: socket.socket) -> tuple[Pending | None, list[Pending]]:
        """Accept one connection and challenge it. Returns it (None when accept failed) and the pending
        connections dropped to make room, which the caller unregisters (`close` closes them)."""
        dropped: list[Pending] = []
        try:
            sock, addr = server.accept()
        except BlockingIOError:
            return None, dropped
        except OSError as exc:  # EMFILE/ENFILE: free the oldest stranger's descriptor and carry on
            dropped += self._evict(1, f"out of file descriptors ({exc.strerror})")
            return None, dropped
        if len(self.pending) >= PENDING_LIMIT:
            dropped += self._evict(1, f"more than {PENDING_LIMIT} unauthenticated connections")
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        nonce = secrets.token_bytes(protocol.NONCE_BYTES)
        conn = Pending(sock, peer, nonce, time.monotonic() + AUTH_TIMEOUT_S)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.send(protocol.frame(protocol.CHALLENGE, nonce))  # 37 bytes into an empty buffer
        except OSError:
            sock.close()
            return None, dropped
        self.pending[sock.fileno()] = conn
        return conn, dropped

    def _evict(self, count: int, why: str) -> list[Pending]:
        out = []
        for fd in list(self.pending)[:count]:
            conn = self.pending.pop(fd)
            self.refuse(conn.peer, why)
            out.append(conn)
        return out

    def receive(self, conn: Pending) -> bytes | None:
        """Read what `conn` sent. Returns the bytes after a valid AUTH frame once it is complete (the
        connection is then the caller's), None while incomplete; ProtocolError (logged, `conn` closed by the
        caller) for anything else."""
        try:
            data = conn.sock.recv(protocol.AUTH_FRAME_BYTES - len(conn.buf))
        except BlockingIOError:
            return None
        except OSError as exc:
            data, why = b"", exc.strerror or str(exc)
        else:
            why = "closed before authenticating"
        if not data:
            raise protocol.ProtocolError(why)
        conn.buf += data
        if len(conn.buf) < protocol.AUTH_FRAME_BYTES:
            if conn.buf[:1] != protocol.AUTH:
                kind = bytes(conn.buf[:1])
                raise protocol.ProtocolError(f"first frame is not an authentication ({kind!r})")
            return None
        protocol.check_auth(bytes(conn.buf), self.token, conn.nonce)
        del self.pending[conn.sock.fileno()]
        return b""

    def expired(self, now: float) -> list[Pending]:
        """Pending connections past their deadline (refused and forgotten; the caller closes them)."""
        late = [c for c in self.pending.values() if now > c.deadline]
        for conn in late:
            del self.pending[conn.sock.fileno()]
            self.refuse(conn.peer, f"no authentication within {AUTH_TIMEOUT_S:g} s")
        return late

    def forget(self, conn: Pending) -> None:
        """`conn` was refused by the caller: drop it from the pending set."""
        with contextlib.suppress(OSError, KeyError):
            del self.pending[conn.sock.fileno()]


def route_source(host: str) -> str | None:
    """The local address this machine uses to reach `host` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def listen(hosts: list[str], remote: bool) -> tuple[list[socket.socket], list[str]]:
    """Listening sockets on only the interfaces the ranks need, and the addresses to give the wrappers:
    loopback for a one-machine job; for a multi-host job, each address this machine reaches a host from (all
    on one port where the system allows). A host whose route cannot be found falls back to every interface,
    said in the returned addresses' order (the wrappers try them in turn)."""
    if not remote:
        sock = socket.create_server(("127.0.0.1", 0), backlog=256)
        return [sock], [f"127.0.0.1:{sock.getsockname()[1]}"]
    sources: list[str] = []
    for host in hosts:
        src = route_source(host)
        if src is None:
            sock = socket.create_server(("0.0.0.0", 0), backlog=256)
            port = sock.getsockname()[1]
            return [sock], [f"{s}:{port}" for s in sources] + [f"{socket.gethostname()}:{port}"]
        if src not in sources:
            sources.append(src)
    servers: list[socket.socket] = []
    port = 0
    for src in sources:
        try:
            servers.append(socket.create_server((src, port), backlog=256))
        except OSError:  # that port is taken on this address: a port of its own
            servers.append(socket.create_server((src, 0), backlog=256))
        port = servers[0].getsockname()[1]
    return servers, [f"{src}:{s.getsockname()[1]}" for src, s in zip(sources, servers, strict=True)]
