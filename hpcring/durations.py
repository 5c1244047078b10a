"""Durations as a person reads them in a progress or summary line."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """`4.2 s`, `3 min 07 s`, `2 h 05 min`: as precise as a person needs at that scale."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"
