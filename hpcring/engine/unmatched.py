"""The collective timeout for requests some ranks submitted and others never did.

The watchdog (watchdog.py) bounds an exchange that never completes. A request only some ranks submit never
reaches an exchange: the others are stuck elsewhere (a data loader, a Python deadlock) or submitted something
else (another name, or another op of the same tensor: `allreduce.x` against `allgather.x`). The engines keep
negotiating, so the negotiation table, identical on every rank, knows who announced what. The set's rank 0
decides when an entry has waited HPCRING_COLLECTIVE_TIMEOUT (`overdue`) and clears a flag bit of the
negotiation vector; every rank sees it in the same cycle, takes a snapshot of the same table (`snapshot`) and
words the same report (`describe`), which the watchdog prints and ends the rank with, the rank that never
submitted included: its engine thread is alive even when its Python code is stuck.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcring.engine.set_state import SetState

_SHOWN = 8  # table entries listed in the report; the rest are counted


@dataclass(frozen=True)
class Unmatched:
    """One request of the table at the moment the timeout was agreed: who announced it, since when."""

    name: str
    op: str
    submitted: tuple[int, ...]  # world ranks
    first_seen: float


def overdue(st: SetState, now: float, timeout_s: float) -> bool:
    """Rank 0 of the set: has any request announced by some ranks waited for the others past the timeout?
    (Every entry of the table lacks some rank: a complete one is ready and leaves the table at once.)"""
    if timeout_s <= 0:
        return False
    return any(now - entry.first_seen >= timeout_s for entry in st.table.values())


def snapshot(st: SetState) -> list[Unmatched]:
    """The table as it is now, oldest first: identical on every rank of the set."""
    rows = []
    for name, entry in st.table.items():
        op = next(iter(entry.sigs.values())).op_type.value
        rows.append(Unmatched(name, op, tuple(sorted(st.ranks[r] for r in entry.sigs)), entry.first_seen))
    rows.sort(key=lambda u: (u.first_seen, u.name))
    return rows


def describe(
    rows: Sequence[Unmatched],
    st: SetState,
    now: float,
    timeout_s: float,
    host: Callable[[int], str],
) -> str:
    """What every rank prints: each waiting request with the ranks that submitted it and those that did not,
    and the ranks that submitted none of them (the ones stuck elsewhere)."""

    def listing(ranks: Sequence[int]) -> str:
        word = "rank" if len(ranks) == 1 else "ranks"
        return f"{word} " + ", ".join(f"{r} (host {host(r)})" for r in ranks)

    joined = {st.ranks[r] for r in st.joined}
    expected = [r for r in st.ranks if r not in joined]
    parts = []
    for row in rows[:_SHOWN]:
        missing = [r for r in expected if r not in row.submitted]
        parts.append(
            f"{row.op} {row.name!r} (waiting {now - row.first_seen:.1f} s) submitted by "
            f"{listing(row.submitted)}, not by {listing(missing)}"
        )
    if len(rows) > _SHOWN:
        parts.append(f"and {len(rows) - _SHOWN} more")
    anyone = {r for row in rows for r in row.submitted}
    idle = [r for r in expected if r not in anyone]
    tail = (
        f" {listing(idle).capitalize()} submitted none of these: stuck before the collective (a data "
        "loader, a deadlock) or on another code path."
        if idle
        else " Every rank submitted some of these: the ranks disagree on names or op types (another name, "
        "or another op of the same tensor)."
    )
    return (
        f"requests of process set {st.id} waited more than {timeout_s:g} s for ranks that did not submit "
        f"them: {'; '.join(parts)}.{tail}"
    )
