"""Walltimes: parse the forms Slurm accepts, and print them as each scheduler takes them.

One parser for profiles, job files and flags keeps "2:00:00" meaning the same thing everywhere.
"""

from __future__ import annotations

import re

_FORM = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


FORMS = "minutes, 'M:SS', 'H:MM:SS', 'D-H', 'D-H:MM' or 'D-H:MM:SS'"


def parse(value: str | int) -> int:
    """Seconds in `value`: minutes (int or "M"), "M:SS", "H:MM:SS", "D-H", "D-H:MM" or "D-H:MM:SS".

    These are exactly Slurm's `--time` forms, so a value copied from a site's documentation means what the
    site means. The leading field of each form is unbounded (90 minutes, 30 hours); the fields after it are
    refused from 60 on (minutes, seconds) or 24 on (hours after a day), where Slurm would silently carry them
    into the next unit and "1:70" would run for 2 min 10 s. Raises ValueError naming the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"bad walltime {value!r}; allowed forms: {FORMS}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"bad walltime {value!r}: must be at least 1 minute")
        return value * 60
    m = _FORM.match(value.strip())
    if not m:
        raise ValueError(f"bad walltime {value!r}; allowed forms: {FORMS}")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        hms = [*parts, 0, 0][:3]  # D-H, D-H:MM, D-H:MM:SS
        _check_range(value, [("hours", hms[0], 24), ("minutes", hms[1], 60), ("seconds", hms[2], 60)])
        seconds = int(days) * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
    elif len(parts) == 1:
        seconds = parts[0] * 60
    elif len(parts) == 2:
        _check_range(value, [("seconds", parts[1], 60)])
        seconds = parts[0] * 60 + parts[1]
    else:
        _check_range(value, [("minutes", parts[1], 60), ("seconds", parts[2], 60)])
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds < 1:
        raise ValueError(f"bad walltime {value!r}: must be positive")
    return seconds


def _check_range(value: str, fields: list[tuple[str, int, int]]) -> None:
    for unit, amount, limit in fields:
        if amount >= limit:
            raise ValueError(
                f"bad walltime {value!r}: {unit} {amount} must be below {limit}; allowed forms: {FORMS}"
            )


def slurm(seconds: int) -> str:
    """Slurm `--time` form: "HH:MM:SS", or "D-HH:MM:SS" from one day on."""
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def lsf(seconds: int) -> str:
    """LSF `-W` form "HH:MM" (minutes rounded up: LSF has no seconds)."""
    minutes = -(-seconds // 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def pbs(seconds: int) -> str:
    """PBS `-l walltime=` form "HH:MM:SS" (hours may exceed 24)."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def flux(seconds: int) -> str:
    """Flux Standard Duration (RFC 23): whole minutes as `90m`, else seconds."""
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def human(seconds: int) -> str:
    """Short form for error messages."""
    return slurm(seconds)
