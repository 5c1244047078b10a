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
import operator
from collections import OrderedDict
from collections.abc import Sequence

from hpcring.engine.request import Signature
from hpcring.engine.request import drain as _drain

_NAME = operator.itemgetter(0)  # Signature.name


class ResponseCache:
    """Signature by bit position, with LRU eviction; `capacity == 0` disables the cache."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_name: dict[str, int] = {}
        self._sigs: dict[int, Signature] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently executed first
        self._next = 0  # high-water mark of used positions
        self._free: list[int] = []  # heap of freed positions below the mark
        self.version = 0  # changes whenever a bit gets another signature (or none): guards derived plans

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

    def lookup_all(self, sigs: Sequence[Signature]) -> list[int] | None:
        """The bits of `sigs` when every one is cached with an identical signature, else None.

        The steady state of a training step (hundreds of resubmitted gradients), answered with C-level passes
        over the lists instead of one `lookup` call per signature."""
        bits = list(map(self._by_name.get, map(_NAME, sigs)))
        if None in bits or list(map(self._sigs.__getitem__, bits)) != list(sigs):  # type: ignore[arg-type]
            return None
        return bits  # type: ignore[return-value]

    def signatures(self, bits: Sequence[int]) -> list[Signature]:
        """The cached signatures at `bits` (each must be occupied)."""
        return list(map(self._sigs.__getitem__, bits))

    def touch(self, bits: Sequence[int], sigs: Sequence[Signature], version: int = -1) -> bool:
        """Record the execution of cached responses: `put` for signatures still cached at their bits, as one
        C-level pass. False (and nothing changed) when any bit no longer holds its signature (an earlier put
        in the same cycle evicted it); the caller then puts them one by one. `version`: the cache's version
        when `sigs` were read at `bits`; unchanged since, they are known to be there without comparing."""
        if version != self.version and list(map(self._sigs.get, bits)) != list(sigs):
            return False
        _drain(map(self._lru.move_to_end, bits))
        return True

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
            if self._sigs[bit] is not sig:
                self._sigs[bit] = sig
                self.version += 1
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
        self.version += 1
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
        self.version += 1
