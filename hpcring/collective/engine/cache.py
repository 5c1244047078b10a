"""The response cache: the steady-state fast path of negotiation.

A training loop submits the same named tensors with the same signatures every step. Once a signature has run,
every rank stores it under the same bit position (all ranks update the cache in the same order: the order in
which responses execute, which negotiation makes identical everywhere). From then on a rank announces a
request by setting its bit, and one bitwise-AND allreduce of a few words per cycle replaces gathering every
request. Eviction is least-recently-executed, again identical on every rank because it depends only on
executed responses.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from hpcring.collective.engine.request import Signature


class ResponseCache:
    """Signature by bit position, with LRU eviction; `capacity == 0` disables the cache."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_name: dict[str, int] = {}
        self._sigs: dict[int, Signature] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently executed first
        self._next = 0  # high-water mark of used positions
        self._free: list[int] = []  # heap of freed positions below the mark

    @property
    def words(self) -> int:
        """64-bit words needed for one bit per entry."""
        return (self.capacity + 63) // 64

    def __len__(self) -> int:
        return len(self._sigs)

    def lookup(self, sig: Signature) -> int | None:
        """The bit of an identical cached signature, or None (absent, or cached with different metadata)."""
        bit = self._by_name.get(sig.name)
        if bit is None or self._sigs[bit] != sig:
            return None
        return bit

    def bit_of(self, name: str) -> int | None:
        return self._by_name.get(name)

    def signature(self, bit: int) -> Signature:
        return self._sigs[bit]

    def bits(self) -> list[int]:
        """Every occupied bit position."""
        return list(self._sigs)

    def put(self, sig: Signature) -> int | None:
        """Record an executed response; returns the bit evicted to make room (its waiters renegotiate)."""
        if self.capacity == 0:
            return None
        bit = self._by_name.get(sig.name)
        if bit is not None:
            self._sigs[bit] = sig
            self._lru.move_to_end(bit)
            return None
        evicted = None
        if self._free:
            bit = heapq.heappop(self._free)  # lowest free position first: the same choice on every rank
        elif self._next < self.capacity:
            bit = self._next
            self._next += 1
        else:
            bit = evicted = next(iter(self._lru))
            self._drop(bit)
            heapq.heappop(self._free)  # _drop freed exactly this bit; take it back
        self._by_name[sig.name] = bit
        self._sigs[bit] = sig
        self._lru[bit] = None
        return evicted

    def evict(self, name: str) -> int | None:
        """Forget `name` (a rank announced it with a different signature); returns its freed bit."""
        bit = self._by_name.get(name)
        if bit is not None:
            self._drop(bit)
        return bit

    def _drop(self, bit: int) -> None:
        sig = self._sigs.pop(bit)
        del self._by_name[sig.name]
        del self._lru[bit]
        heapq.heappush(self._free, bit)
