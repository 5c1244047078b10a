"""Cross-rank agreement on a collective's arguments, so that a mismatch fails everywhere instead of hanging.

Each rank checks its own arguments, then all ranks exchange a digest of a small signature (dtype, shapes, op,
root, scale factors, algorithm) and an error flag in one tiny allgather. Every rank sees the same table, so
every rank reaches the same verdict; only if something is wrong are full signatures and messages exchanged:
the rank whose argument was bad re-raises its own error, the others raise CollectiveError naming it; a
disagreement raises CollectiveError on all, naming the ranks and their values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import numpy as np

from hpcring.collective.backends.base import Transport
from hpcring.errors import CollectiveError, HpcringError

T = TypeVar("T")
Signature = dict[str, Any]
_EXTRAS = 2


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def describe_mismatch(what: str, key: str, values: list[Any]) -> str:
    """Message for a field that differs: each distinct value with the ranks that passed it."""
    groups: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(repr(v), []).append(r)
    parts = "; ".join(f"{v} on {_ranks(rs)}" for v, rs in groups.items())
    return f"{what}: {key} differs across ranks: {parts}; every rank must pass the same {key}"


def _digest(sig: Signature) -> int:
    """Process-independent 63-bit digest of the compared fields (Python's hash() is salted per process)."""
    text = repr(sorted((k, v) for k, v in sig.items() if not k.startswith("_")))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _slow_verdict(t: Transport, what: str, sig: Signature | None, error: HpcringError | None) -> NoReturn:
    """Gather full signatures and messages (only after the fast check found a problem) and raise."""
    gathered = t.allgather_object((sig, None if error is None else str(error)))
    if error is not None:
        raise error
    failed = [(r, msg) for r, (_, msg) in enumerate(gathered) if msg is not None]
    if failed:
        detail = "; ".join(f"rank {r}: {msg}" for r, msg in failed)
        raise CollectiveError(f"{what}: invalid arguments on {_ranks([r for r, _ in failed])} ({detail})")
    sigs: list[Signature] = [s for s, _ in gathered]
    for key in sigs[0]:
        if key.startswith("_"):
            continue
        values = [s.get(key) for s in sigs]
        if any(v != values[0] for v in values):
            raise CollectiveError(describe_mismatch(what, key, values))
    raise CollectiveError(f"{what}: arguments differ across ranks")  # digests differed: some field did


def agree(t: Transport, what: str, sig: Signature | None, error: HpcringError | None) -> list[Signature]:
    """Agree on signatures; raise on every rank if any rank failed locally or any compared field differs.

    The common case costs one small allgather of (digest, error flag, up to two integer extras). Keys starting
    with `_` are such per-rank extras (allgather's row count): gathered, returned, not compared. Only when
    something is wrong do the ranks exchange full signatures to name the culprits in the message.
    """
    extras = sorted(k for k in (sig or {}) if k.startswith("_"))
    if len(extras) > _EXTRAS:
        raise ValueError(f"at most {_EXTRAS} per-rank extras, got {extras}")
    mine = np.zeros(2 + _EXTRAS, dtype=np.int64)
    if sig is not None and error is None:
        mine[0] = _digest(sig)
        mine[2 : 2 + len(extras)] = [int(sig[k]) for k in extras]
    else:
        mine[1] = 1
    table = np.empty((t.size, 2 + _EXTRAS), dtype=np.int64)
    t.allgather(mine, table)
    rows = table.tolist()  # a few Python ints: cheaper to compare than numpy calls on tiny arrays
    first = rows[0][0]
    if any(row[1] or row[0] != first for row in rows):
        _slow_verdict(t, what, sig, error)
    assert sig is not None
    if not extras:
        return [sig] * len(rows)
    return [{**sig, **{k: row[2 + i] for i, k in enumerate(extras)}} for row in rows]


def prepare(
    t: Transport, what: str, validate: bool, check: Callable[[], tuple[Signature, T]]
) -> tuple[T, list[Signature] | None]:
    """Run the local `check`; with `validate`, agree across ranks first (the gathered signatures are
    returned)."""
    try:
        sig, payload = check()
    except HpcringError as exc:
        if not validate:
            raise
        agree(t, what, None, exc)
        raise AssertionError("unreachable: agree re-raises the local error") from exc
    if not validate:
        return payload, None
    return payload, agree(t, what, sig, None)
