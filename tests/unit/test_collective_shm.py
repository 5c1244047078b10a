"""The shared-memory allreduce's settings: slot size and directory from the environment, bad values named."""

from __future__ import annotations

import pytest

from hpcring.collective.algorithms import shm
from hpcring.errors import ConfigError


def test_slot_limit_default_env_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shm.SLOT_ENV, raising=False)
    assert shm.slot_limit() == shm.DEFAULT_SLOT_BYTES
    monkeypatch.setenv(shm.SLOT_ENV, str(4 << 20))
    assert shm.slot_limit() == 4 << 20
    for bad in ("1000", "lots", "-5"):
        monkeypatch.setenv(shm.SLOT_ENV, bad)
        with pytest.raises(
            ConfigError, match=f"HPCRING_SHM_SLOT_BYTES={bad!r} is invalid; allowed: an integer"
        ):
            shm.slot_limit()


def test_directory_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shm.DIR_ENV, raising=False)
    assert shm.shm_dir() == "/dev/shm"
    monkeypatch.setenv(shm.DIR_ENV, "/run/user/0")
    assert shm.shm_dir() == "/run/user/0"
