"""The wall-clock contract and the durable checkpoint folder's rules, without launching ranks
(tests/elastic/test_requeue.py runs them under the real launcher)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcring.contracts import wallclock as contract
from hpcring.errors import ConfigError
from hpcring.torch.elastic import durable


def test_requeue_bounds_default_to_three_limits_and_unbounded_preemptions() -> None:
    assert contract.max_requeues({}) == {"limit": 3, "preempt": None}
    assert contract.max_requeues({contract.MAX_REQUEUES: "5"}) == {"limit": 5, "preempt": None}
    assert contract.max_requeues({contract.MAX_REQUEUES: "none,2"}) == {"limit": None, "preempt": 2}


@pytest.mark.parametrize("raw", ["-1", "x", "1,2,3", "1.5"])
def test_a_bad_bound_names_the_variable_and_the_allowed_values(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"HPCRING_MAX_REQUEUES=.*(integer >= 0 or 'none'|allowed: N)"):
        contract.max_requeues({contract.MAX_REQUEUES: raw})


def test_warning_signals_map_to_kinds() -> None:
    import signal

    assert contract.kind_of(signal.SIGUSR1) == "limit"
    assert contract.kind_of(signal.SIGUSR2) == "preempt"
    assert contract.kind_of(signal.SIGTERM) is None


def _manifest(seq: int, stop: int, **over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "seq": seq,
        "stop": stop,
        "step": seq * 2,
        "size": 2,
        "kind": "limit",
        "written": 1.0,
        "requeues": {"limit": stop, "preempt": 0},
    }
    return {**base, **over}


def _folder(root: Path, name: str, manifest: object | None, raw: bytes | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if raw is not None:
        (folder / durable.MANIFEST).write_bytes(raw)
    elif manifest is not None:
        (folder / durable.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_the_newest_complete_checkpoint_wins_incomplete_or_hostile_ones_are_ignored(tmp_path: Path) -> None:
    _folder(tmp_path, "checkpoint-000000000003-0001", _manifest(3, 1))
    best = _folder(tmp_path, "checkpoint-000000000003-0002", _manifest(3, 2))
    _folder(tmp_path, "checkpoint-000000000009-0003", None)  # killed before its manifest: incomplete
    _folder(tmp_path, "checkpoint-000000000010-0003", None, raw=b"\xff\x00not json")
    _folder(tmp_path, "checkpoint-000000000011-0003", _manifest(11, 3, size="2"))
    _folder(tmp_path, "checkpoint-000000000012-0003", _manifest(12, 3, requeues={"limit": -1, "preempt": 0}))
    _folder(tmp_path, "checkpoint-000000000013-0003", [1, 2])
    found = durable.newest(tmp_path)
    assert found is not None and found[0] == best and found[1]["stop"] == 2
    assert durable.newest(tmp_path / "missing") is None


def test_a_durable_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.commit"
    durable.write_durable(target, b"old")
    durable.write_durable(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["state.commit"]  # no temporary file left
