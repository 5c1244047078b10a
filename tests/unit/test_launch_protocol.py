"""The control protocol's checks without a job (issue 35): authentication, JSON bounds, message schemas."""

from __future__ import annotations

import pytest

from hpcring.launch import protocol
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
