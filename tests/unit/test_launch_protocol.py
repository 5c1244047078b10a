"""The control protocol's checks without a job (issue 35): authentication, JSON bounds, message schemas."""

from __future__ import annotations

import socket
import time

import pytest

from hpcring.launch import control, protocol
from hpcring.launch.protocol import ProtocolError

TOKEN = "0123456789abcdef0123456789abcdef"
NONCE = bytes(range(protocol.NONCE_BYTES))


def test_the_mac_proves_the_token_without_carrying_it() -> None:
    good = protocol.frame(protocol.AUTH, protocol.mac(TOKEN, NONCE))
    protocol.check_auth(good, TOKEN, NONCE)
    assert TOKEN.encode() not in good
    with pytest.raises(ProtocolError, match="wrong job token"):
        protocol.check_auth(good, TOKEN, bytes(32))  # another connection's nonce: no replay
    with pytest.raises(ProtocolError, match="wrong job token"):
        protocol.check_auth(protocol.frame(protocol.AUTH, protocol.mac("x" * 32, NONCE)), TOKEN, NONCE)
    with pytest.raises(ProtocolError, match="not an authentication"):
        protocol.check_auth(protocol.frame(protocol.HELLO, bytes(32)), TOKEN, NONCE)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"[" * 200_000, "nested deeper than 8"),
        (b'{"a":' * 9 + b"1" + b"}" * 9, "nested deeper than 8"),
        (b"[]", "is a list, not an object"),
        (b"\xff\xfe", "malformed JSON"),
        (b'{"rank": 1', "malformed JSON"),
        (b" " * (protocol.MAX_JSON + 1), "exceeds"),
    ],
)
def test_json_is_bounded_before_it_is_parsed(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.decode(payload)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = b'{"host": "' + b"[{" * 100 + b'\\"[", "rank": 0, "size": 1}'
    assert protocol.hello(text)["host"].startswith("[{[{")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"size": 2, "host": "h"}', "lacks field 'rank'"),
        (b'{"rank": "0", "size": 2, "host": "h"}', "field 'rank' is str, expected int"),
        (b'{"rank": true, "size": 2, "host": "h"}', "field 'rank' is bool, expected int"),
        (b'{"rank": 0, "size": 2, "host": ["h"]}', "field 'host' is list, expected str"),
        (b'{"rank": 0, "size": 2, "host": "' + b"h" * 300 + b'"}', "longer than 255"),
    ],
)
def test_hello_fields_are_type_checked(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.hello(payload)


def test_exit_reports_are_type_checked() -> None:
    ok = protocol.exited(b'{"code": 3, "signal": null, "reason": "x"}')
    assert ok == {"code": 3, "signal": None, "ended_by_launcher": False, "error": None, "reason": "x"}
    with pytest.raises(ProtocolError, match="field 'code' is float, expected int or null"):
        protocol.exited(b'{"code": 1.5, "signal": null}')
    with pytest.raises(ProtocolError, match="field 'error' is list"):
        protocol.exited(b'{"code": 1, "signal": null, "error": []}')


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_buffered() -> None:
    reader = protocol.FrameReader(limit=16)
    assert list(reader.feed(protocol.frame(protocol.STDOUT, b"x" * 16))) == [(protocol.STDOUT, b"x" * 16)]
    with pytest.raises(ProtocolError, match="exceeds 16"):
        list(reader.feed(b"O\x00\x00\x00\x11"))


def _challenge(client: socket.socket) -> bytes:
    data = b""
    while len(data) < protocol.HEADER_BYTES + protocol.NONCE_BYTES:
        data += client.recv(64)
    return data[protocol.HEADER_BYTES :]


def test_the_gate_admits_the_token_holder_and_bounds_strangers() -> None:
    notes: list[str] = []
    gate = control.Gate(TOKEN, notes.append)
    (server,), addresses = control.listen([], remote=False)
    assert server.getsockname()[0] == "127.0.0.1" and addresses == [f"127.0.0.1:{server.getsockname()[1]}"]
    with server:
        clients = [socket.create_connection(server.getsockname()) for _ in range(control.PENDING_LIMIT + 1)]
        accepted = [gate.accept(server) for _ in clients]
        dropped = [p for _, gone in accepted for p in gone]
        assert len(gate.pending) == control.PENDING_LIMIT and len(dropped) == 1
        assert dropped[0] is accepted[0][0]  # the oldest made room
        assert notes == [
            f"dropped a control connection from {dropped[0].peer}: more than 64 unauthenticated connections"
        ]
        newest, pending = clients[-1], accepted[-1][0]
        assert pending is not None
        newest.sendall(protocol.frame(protocol.AUTH, protocol.mac(TOKEN, _challenge(newest))))
        deadline = time.monotonic() + 10
        while (rest := gate.receive(pending)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rest == b"" and pending.sock.fileno() not in gate.pending
        late = gate.expired(time.monotonic() + control.AUTH_TIMEOUT_S + 1)
        assert len(late) == control.PENDING_LIMIT - 1 and not gate.pending
        for conn in [*late, *dropped, pending]:
            conn.sock.close()
        for client in clients:
            client.close()


def test_a_multi_host_job_listens_on_the_route_to_its_hosts_only() -> None:
    servers, addresses = control.listen(["127.0.0.1"], remote=True)
    try:
        assert [s.getsockname()[0] for s in servers] == ["127.0.0.1"]  # not 0.0.0.0
        assert addresses == [f"127.0.0.1:{servers[0].getsockname()[1]}"]
    finally:
        for s in servers:
            s.close()
