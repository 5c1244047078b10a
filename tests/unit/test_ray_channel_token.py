"""The Ray actor's channel to its worker admits only the worker's token (issue 27, item 6).

Unpickling runs code, so a local stranger who connects to the actor's port before the worker must be dropped
before anything it sends is unpickled; the token itself reaches the worker in its environment, not argv.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import threading
from pathlib import Path

from hpcring.ray import channel
from hpcring.ray.actor import _accept_worker


class _Boom:
    """Unpickling this writes a file: the proof that a stranger's bytes were unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.path), "unpickled"))  # type: ignore[return-value]


def test_admit_compares_the_first_bytes() -> None:
    a, b = socket.socketpair()
    with a, b:
        channel.present(a, "f" * 32)
        assert channel.admit(b, "f" * 32)
    a, b = socket.socketpair()
    with a, b:
        channel.present(a, "e" * 32)
        assert not channel.admit(b, "f" * 32)
    a, b = socket.socketpair()
    with a, b:
        a.close()  # nothing sent: refused, not an error
        assert not channel.admit(b, "f" * 32, timeout=1)


def test_a_stranger_racing_the_worker_is_dropped_unread(tmp_path: Path) -> None:
    token = "0123456789abcdef" * 2
    proof = tmp_path / "proof"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]

    def stranger_then_worker() -> None:
        with socket.create_connection(("127.0.0.1", port)) as stranger:
            data = channel.dumps(("hello", _Boom(str(proof))))
            stranger.sendall(b"x" * 32 + len(data).to_bytes(8, "big") + data)
            with contextlib.suppress(OSError):  # dropped with its bytes unread: a reset
                stranger.recv(1)
        worker = socket.create_connection(("127.0.0.1", port))
        channel.present(worker, token)
        channel.send(worker, ("hello", 42))
        worker.recv(1)
        worker.close()

    thread = threading.Thread(target=stranger_then_worker)
    thread.start()
    with listener:
        sock = _accept_worker(listener, token)
    with sock:
        assert channel.recv(sock) == ("hello", 42)
    thread.join(10)
    assert not proof.exists(), "the stranger's pickle was loaded"
    assert pickle.dumps(("hello", 42))  # the genuine message is an ordinary pickle
