"""Walltimes: parse the forms Slurm accepts, and print them as each scheduler takes them.

One parser for profiles, job files and flags keeps "2:00:00" meaning the same thing everywhere.
"""

from __future__ import annotations

import re

_FORM = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def parse(value: str | int) -> int:
    """Seconds in `value`: minutes (int or "MM"), "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS".

    These are exactly Slurm's `--time` forms, so a value copied from a site's documentation means what the
    site means. Raises ValueError naming the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"bad walltime {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"bad walltime {value!r}: must be at least 1 minute")
        return value * 60
    m = _FORM.match(value.strip())
    if not m:
        raise ValueError(
            f"bad walltime {value!r}; allowed forms: minutes, 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', "
            "'D-HH:MM:SS'"
        )
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        hms = [*parts, 0, 0][:3]  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = int(days) * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
    elif len(parts) == 1:
        seconds = parts[0] * 60
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds < 1:
        raise ValueError(f"bad walltime {value!r}: must be positive")
    return seconds


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
