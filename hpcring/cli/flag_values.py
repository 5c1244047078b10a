"""Flag values: each flag's default from its HPCRING_* environment variable, so CI and batch scripts can set
it once, and numbers whose errors name the flag."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from hpcring.errors import ConfigError, shown, shown_text

T = TypeVar("T")


def env(*names: str) -> str | None:
    """The first of the variables that is set and not empty."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def env_flag(name: str) -> bool:
    """A switch's default: 1/true/yes/on."""
    return (env(name) or "").strip().lower() in ("1", "true", "yes", "on")


def env_list(name: str, sep: str = ",") -> list[str]:
    """A repeatable flag's default: the variable's items, empty ones left out."""
    return [x for x in (env(name) or "").split(sep) if x]


def env_default(name: str, convert: Callable[[str], T] | None = None) -> T | str | None:
    """The value of `name` (converted), or None; a bad value names the variable."""
    raw = env(name)
    if raw is None or convert is None:
        return raw
    try:
        return convert(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is not valid: {exc}") from exc


def number(
    kind: Callable[[str], float],
    text: str,
    flag: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """`text` as an int or float, from `minimum` to `maximum`; else a ConfigError naming the flag."""
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{flag} {shown(text)} is not a {'whole ' if kind is int else ''}number") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum:g}, got {shown_text(text)}")
    if maximum is not None and value > maximum:
        bound = int(maximum) if float(maximum).is_integer() else maximum
        raise ConfigError(f"{flag} must be at most {bound}, got {shown_text(text)}")
    return value
