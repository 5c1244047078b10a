"""CPU list notation used in profiles and binding flags: "0-3,8,10-11" <-> sorted tuples, and hex masks.

Profiles write core sets the way `lscpu` and the site guides do (ranges), so that a profile reads like the
documentation it cites; binding flags need the same sets as lists or as hexadecimal masks.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse(text: str | int | Iterable[int]) -> tuple[int, ...]:
    """Parse "0-3,8" (or an int, or a list of ints) into a sorted tuple without duplicates.

    Raises ValueError with the offending piece, so profile errors can name it.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a CPU list, got {text!r}")
    if isinstance(text, int):
        return (text,)
    if not isinstance(text, str):
        return tuple(sorted({int(v) for v in text}))
    out: set[int] = set()
    for piece in text.replace(" ", "").split(","):
        if not piece:
            continue
        lo, sep, hi = piece.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad CPU range {piece!r} (expected N or N-M)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"bad CPU range {piece!r} (end before start)")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


def ranges(cpus: Iterable[int]) -> list[tuple[int, int]]:
    """Collapse CPU numbers into sorted inclusive (start, end) runs."""
    runs: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if runs and runs[-1][1] == c - 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


def format_list(cpus: Iterable[int]) -> str:
    """ "0-3,8": the compact notation of `lscpu`, Slurm node lists and the ERF."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges(cpus))


def mask(cpus: Iterable[int]) -> str:
    """Hexadecimal affinity mask ("0x3" for CPUs 0 and 1), as Slurm's mask_cpu/mask_gpu expect."""
    value = 0
    for c in cpus:
        value |= 1 << c
    return hex(value)
