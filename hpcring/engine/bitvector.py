"""The negotiation vector's words: flags stored inverted (so a bitwise AND over the ranks answers "does any
rank ...?") and bit sets of response-cache positions packed into Python ints."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

# Word 0 of the negotiation vector: flags stored inverted, so AND over ranks answers "does any rank ...?".
_NO_NEW = 1  # this rank has no uncached request to announce

_NO_SHUTDOWN = 2  # this rank does not ask to shut down

_NO_ABORT = 4  # this rank (the set's rank 0) does not ask to abort on a stall

_NO_TIMEOUT = 8  # this rank (the set's rank 0) does not see a request unmatched past the collective timeout

_ALL_FLAGS = _NO_NEW | _NO_SHUTDOWN | _NO_ABORT | _NO_TIMEOUT

_FEW_BITS = 16  # below this many bits, Python ints pack faster than numpy


def _pack_bits(bits: Collection[int], n: int) -> int:
    """The int with the `n` distinct bit positions `bits` set.

    A training step's gradients sit at consecutive cache bits (assigned in first-execution order), so a run
    of consecutive positions (n distinct values from min to max) is one shift; otherwise numpy for many bits
    (one C pass instead of n big-int operations)."""
    if n <= _FEW_BITS:
        mask = 0
        for b in bits:
            mask |= 1 << b
        return mask
    low = min(bits)
    if max(bits) - low + 1 == n:
        return ((1 << n) - 1) << low
    positions = np.fromiter(bits, dtype=np.intp, count=n)
    flags = np.zeros(int(positions.max()) + 1, dtype=np.uint8)
    flags[positions] = 1
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def _unpack_bits(mask: int) -> list[int]:
    """Positions of the set bits of `mask`, in increasing order (a single run of ones is one `range`)."""
    if mask.bit_count() <= _FEW_BITS:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out
    low = (mask & -mask).bit_length() - 1
    run = mask >> low
    if not run & (run + 1):  # all ones
        return list(range(low, low + run.bit_length()))
    raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    positions: list[int] = np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
    return positions
