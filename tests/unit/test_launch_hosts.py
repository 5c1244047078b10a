"""Host lists, hostfiles, capacity checks and the rank layout (local/cross values)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hpcring.errors import ConfigError
from hpcring.launch.hosts import Host, check_capacity, is_local, parse_host_list, parse_hostfile
from hpcring.launch.layout import Place, emulated_nodes, node_of_hosts, places


def test_host_list() -> None:
    assert parse_host_list("n1:2, n2:4,n3") == [Host("n1", 2), Host("n2", 4), Host("n3", 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n1:0", "at least 1"),
        ("n1:x", "'x' is not an integer"),
        ("n1,,n2", "empty host entry"),
        ("n1:2,n1:2", "listed twice"),
        ("bad host:2", "invalid host name"),
    ],
)
def test_host_list_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_host_list(text)


def test_hostfile_both_dialects(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# comment\nn1 slots=2 max_slots=4\n\nn2:3   # hydra style\nn3\n")
    assert parse_hostfile(f) == [Host("n1", 2), Host("n2", 3), Host("n3", 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n1 slots=0\n", "line 1: slot count must be at least 1"),
        ("n1 cpus=2\n", "line 1: unexpected 'cpus=2'"),
        ("# nothing\n", "lists no hosts"),
        ("n1\nn1\n", "listed twice"),
    ],
)
def test_hostfile_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse_hostfile(f)


def test_capacity() -> None:
    assert check_capacity(4, [Host("n1", 2), Host("n2", 2)]) is False
    assert check_capacity(8, [Host("localhost", 2)]) is True  # oversubscribing this machine is allowed
    with pytest.raises(ConfigError, match="-np 5 is more than the 4 slots of the given hosts"):
        check_capacity(5, [Host("n1", 2), Host("n2", 2)])


def test_is_local() -> None:
    assert is_local("localhost") and is_local("127.0.0.1") and is_local(socket.gethostname())
    assert not is_local("some-other-node-name")


def test_emulated_nodes() -> None:
    assert emulated_nodes(4, 2) == [0, 0, 1, 1]
    assert emulated_nodes(5, 2) == [0, 0, 0, 1, 1]
    with pytest.raises(ConfigError, match="between 1 and the number of ranks"):
        emulated_nodes(2, 3)


def test_places_even_and_uneven() -> None:
    assert places([0, 0, 1, 1]) == [
        Place(0, 0, 0, 2, 0, 2),
        Place(1, 0, 1, 2, 0, 2),
        Place(2, 1, 0, 2, 1, 2),
        Place(3, 1, 1, 2, 1, 2),
    ]
    # 3 ranks on node 0, 1 on node 1: local rank 1 and 2 exist only on node 0 (Horovod's cross groups).
    got = places([0, 0, 0, 1])
    assert [(p.local_rank, p.local_size, p.cross_rank, p.cross_size) for p in got] == [
        (0, 3, 0, 2),
        (1, 3, 0, 1),
        (2, 3, 0, 1),
        (0, 1, 1, 2),
    ]


def test_nodes_from_hostnames_follow_rank_order() -> None:
    assert node_of_hosts(["b", "b", "a", "a", "b"]) == [0, 0, 1, 1, 0]
    assert [p.local_rank for p in places(node_of_hosts(["b", "a", "b", "a"]))] == [0, 0, 1, 1]
