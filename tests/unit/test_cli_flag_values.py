"""Flag defaults from HPCRING_* variables and number parsing, shared by every subcommand."""

from __future__ import annotations

import pytest

from hpcring.cli.flag_values import env, env_default, env_flag, env_list, number
from hpcring.errors import ConfigError


def test_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCRING_A", "")
    monkeypatch.setenv("HPCRING_B", "b")
    monkeypatch.delenv("HPCRING_C", raising=False)
    assert env("HPCRING_A") is None and env("HPCRING_C") is None
    assert env("HPCRING_A", "HPCRING_C", "HPCRING_B") == "b"  # the first set and not empty
    for value, on in (("1", True), (" yes ", True), ("ON", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("HPCRING_F", value)
        assert env_flag("HPCRING_F") is on, value
    monkeypatch.setenv("HPCRING_L", "a,,b")
    assert env_list("HPCRING_L") == ["a", "b"] and env_list("HPCRING_C") == []
    monkeypatch.setenv("HPCRING_L", "x=1\ny=2")
    assert env_list("HPCRING_L", "\n") == ["x=1", "y=2"]
    monkeypatch.setenv("HPCRING_N", "7")
    assert env_default("HPCRING_N", int) == 7 and env_default("HPCRING_N") == "7"
    monkeypatch.setenv("HPCRING_N", "seven")
    with pytest.raises(ConfigError, match="environment variable HPCRING_N='seven' is not valid"):
        env_default("HPCRING_N", int)


def test_numbers_name_their_flag() -> None:
    assert number(int, "3", "-np", minimum=1) == 3 and number(float, "-2.5", "--x") == -2.5
    with pytest.raises(ConfigError, match=r"^-np 'x' is not a whole number$"):
        number(int, "x", "-np")
    with pytest.raises(ConfigError, match=r"^--ssh-port 'p' is not a number$"):
        number(float, "p", "--ssh-port")
    with pytest.raises(ConfigError, match=r"^-np must be at least 1, got 0$"):
        number(int, "0", "-np", minimum=1)
