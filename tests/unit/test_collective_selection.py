"""Algorithm choice: keyword, environment, the documented `auto` rule, and the ring chunk knob."""

from __future__ import annotations

import functools

import pytest

from hpcring.collective import selection
from hpcring.collective.selection import choose_algorithm, resolve_algorithm
from hpcring.errors import ConfigError


def test_resolve_keyword_env_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(selection.ALGORITHM_ENV, raising=False)
    assert resolve_algorithm(None) == "auto"
    assert resolve_algorithm("Ring") == "ring"
    monkeypatch.setenv(selection.ALGORITHM_ENV, "hierarchical")
    assert resolve_algorithm(None) == "hierarchical"
    assert resolve_algorithm("native") == "native"  # the keyword wins over the environment


def test_unknown_algorithm_names_source_and_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        ConfigError,
        match="'tree' \\(from algorithm\\); allowed: 'auto', 'native', 'ring', 'hierarchical' or 'shm'",
    ):
        resolve_algorithm("tree")
    monkeypatch.setenv(selection.ALGORITHM_ENV, "tree")
    with pytest.raises(ConfigError, match="from HPCRING_ALLREDUCE_ALGORITHM"):
        resolve_algorithm(None)


def test_auto_rule_one_node() -> None:
    """Two or three ranks: native, then the ring. From SHM_MIN_RANKS ranks: native, then shared memory."""
    ring, shm = selection.RING_MIN_BYTES, selection.SHM_MIN_BYTES
    for local in (2, 3):
        for nbytes in (8, 64 << 10, ring - 4):
            assert choose_algorithm(nbytes, native_exact=True, local_size=local, cross_size=1) == "native"
        for nbytes in (ring, 64 << 20):
            assert choose_algorithm(nbytes, native_exact=True, local_size=local, cross_size=1) == "ring"
    for local in (selection.SHM_MIN_RANKS, 8):
        assert choose_algorithm(shm - 4, native_exact=True, local_size=local, cross_size=1) == "native"
        for nbytes in (shm, 64 << 20):
            assert choose_algorithm(nbytes, native_exact=True, local_size=local, cross_size=1) == "shm"


def test_the_engine_takes_shared_memory_from_two_ranks() -> None:
    """The engine's lower rank minimum (its collectives run beside a training thread): shm from 2 ranks on
    one node, native below the size floor, and nothing changes across nodes."""
    from hpcring.engine.host_plane import ENGINE_SHM_MIN_RANKS

    shm = selection.SHM_MIN_BYTES
    rule = functools.partial(choose_algorithm, native_exact=True, shm_min_ranks=ENGINE_SHM_MIN_RANKS)
    assert ENGINE_SHM_MIN_RANKS == 2
    for local in (2, 3, 8):
        assert rule(shm - 4, local_size=local, cross_size=1) == "native"
        assert (
            rule(shm, local_size=local, cross_size=1)
            == rule(64 << 20, local_size=local, cross_size=1)
            == "shm"
        )
    assert rule(64 << 20, local_size=1, cross_size=1) == "ring"  # one rank: nobody to share with
    assert rule(64 << 20, local_size=2, cross_size=2) == "hierarchical"
    assert rule(64 << 20, local_size=1, cross_size=2) == "ring"


def test_auto_rule_half_precision_switches_earlier() -> None:
    half = selection.HALF_RING_MIN_BYTES
    assert half < selection.RING_MIN_BYTES
    for local, big in ((2, "ring"), (4, "shm")):
        assert choose_algorithm(half - 2, native_exact=False, local_size=local, cross_size=1) == "native"
        assert choose_algorithm(half, native_exact=False, local_size=local, cross_size=1) == big
        assert choose_algorithm(half, native_exact=True, local_size=local, cross_size=1) == "native"


def test_auto_rule_several_nodes() -> None:
    t = selection.HIERARCHICAL_MIN_BYTES
    assert choose_algorithm(t, native_exact=True, local_size=2, cross_size=2) == "hierarchical"
    assert choose_algorithm(t, native_exact=False, local_size=2, cross_size=2) == "hierarchical"
    assert choose_algorithm(t - 4, native_exact=True, local_size=2, cross_size=2) == "native"
    # one rank per node: no node-local stage to exploit, the flat ring moves the least
    assert choose_algorithm(t, native_exact=True, local_size=1, cross_size=4) == "ring"
    # shared memory only where every rank is on one node
    assert choose_algorithm(64 << 20, native_exact=True, local_size=8, cross_size=2) == "hierarchical"


def test_chunk_bytes_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(selection.CHUNK_ENV, raising=False)
    assert selection.chunk_bytes(123) == 123
    monkeypatch.setenv(selection.CHUNK_ENV, "4096")
    assert selection.chunk_bytes(123) == 4096
    monkeypatch.setenv(selection.CHUNK_ENV, "-1")
    with pytest.raises(ConfigError, match="positive number of bytes"):
        selection.chunk_bytes(123)
