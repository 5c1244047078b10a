"""Negotiation: which requests are ready on every rank of a set (steps 1 and 2 of `engine.py`'s docstring).

Cached requests travel as bits of one small non-blocking allreduce; uncached ones are announced through an
allgather of their signatures into a table that is identical on every rank, where they are validated."""

from __future__ import annotations

import time
from itertools import repeat
from typing import Any

import numpy as np

from hpcring.config import EngineSettings
from hpcring.engine import unmatched
from hpcring.engine.bitvector import (
    _ALL_FLAGS,
    _NO_ABORT,
    _NO_NEW,
    _NO_SHUTDOWN,
    _NO_TIMEOUT,
    _pack_bits,
    _unpack_bits,
)
from hpcring.engine.core import wait_polled
from hpcring.engine.engine_state import EngineState, patience_s
from hpcring.engine.joined import _NO_STAND_IN
from hpcring.engine.request import CACHEABLE, OpType, Signature
from hpcring.engine.responses import _ALLREDUCE, _JOIN, _REQ_SIG, Response, _response
from hpcring.engine.set_state import Entry, SetState
from hpcring.engine.stall_inspector import _STALL_CHECK_EVERY_S, StallInspector
from hpcring.engine.table_check import check_agreement
from hpcring.engine.timeline import Timeline


class Negotiator:
    """Steps 1 and 2 of a cycle for one set at a time; runs on whichever thread runs the cycle."""

    def __init__(self, state: EngineState, mpi: Any) -> None:
        self._state = state
        self._mpi = mpi
        self._stalls = StallInspector(state)
        self._patience_of: EngineSettings | None = None  # the settings `_patience` was worked out for
        self._patience: float | None = None

    def _agree(self, st: SetState, flags: int, hit: int, absent: int) -> tuple[int, int, int]:
        """Bitwise AND over the set's ranks of this rank's (flags, hit, absent) words (see `_vector`).

        The bit sets travel as Python ints serialised little-endian: a few byte conversions instead of a loop
        over words (and a bitwise AND does not care about byte order). The allreduce is non-blocking and
        polled (`progress.wait_polled`): a blocking MPI call busy-polls, and when ranks outnumber cores that
        spin steals the CPU the other ranks need. A set of one rank agrees with itself: no vector at all."""
        if st.size == 1:
            return flags, hit, absent
        nbytes = 8 * st.cache.words
        raw = flags.to_bytes(8, "little") + hit.to_bytes(nbytes, "little") + absent.to_bytes(nbytes, "little")
        vec = np.frombuffer(bytearray(raw), dtype=np.uint64)
        # The datatype named, not inferred from the array: the compiled lone cycle sends the same words
        # (engine/lone_cycle.py), and a collective's ranks must agree on it.
        wait_polled(st.comm.Iallreduce(self._mpi.IN_PLACE, [vec, self._mpi.UINT64_T], op=self._mpi.BAND))
        raw = vec.tobytes()
        return (
            int.from_bytes(raw[:8], "little"),
            int.from_bytes(raw[8 : 8 + nbytes], "little"),
            int.from_bytes(raw[8 + nbytes :], "little"),
        )

    def _intake(self, st: SetState, timeline: Timeline | None, now: float) -> None:
        with self._state.lock:  # emptied, never replaced: the core's submit keeps the list (set_state.py)
            new = st.incoming.copy()
            st.incoming.clear()
        if len(new) == 1 and timeline is None:  # the latency path
            bit = st.cache.lookup(new[0].sig)  # None for anything never cached (join, barrier, ...)
            if bit is not None:
                st.cached_wait[bit] = new[0]
                new = []
        elif new and timeline is None:
            bits = st.cache.lookup_all(list(map(_REQ_SIG, new)))
            if bits is not None:  # the steady state: every new request is cached (C-level passes)
                st.cached_wait.update(zip(bits, new, strict=True))
                new = []
        lookup, cached_wait, outbox = st.cache.lookup, st.cached_wait, st.outbox
        for req in new:
            sig = req.sig
            if timeline is not None and sig.name not in st.negotiating:
                st.negotiating.add(sig.name)
                timeline.begin(sig.name, f"NEGOTIATE_{sig.op_type.name}", when=req.submitted_at)
            op = sig.op_type
            if op is _JOIN:
                st.local_join = req
            elif op is _ALLREDUCE or op in CACHEABLE:  # `is` first: hashing an Enum runs Python code
                bit = lookup(sig)
                if bit is not None:
                    cached_wait[bit] = req
                    continue
            outbox.append(req)
        if st.joined:  # ops some rank has joined out of cannot complete from the cache: to the table
            for bit, req in list(cached_wait.items()):
                if req.sig.op_type in _NO_STAND_IN:
                    del cached_wait[bit]
                    outbox.append(req)
        # Cached requests waiting long go through the table, where the stall inspector and the collective
        # timeout (unmatched.py) can name missing ranks. Scanned a few times per patience period, not every
        # cycle (a fused step keeps hundreds cached).
        settings = self._state.settings
        if settings is not self._patience_of:  # worked out once per settings object (a tune replaces it)
            self._patience_of, self._patience = settings, patience_s(settings)
        patience = self._patience
        if cached_wait and patience is not None and now - st.last_patience_scan > patience / 4:
            st.last_patience_scan = now
            for bit, req in list(cached_wait.items()):
                if now - req.submitted_at > patience:
                    del cached_wait[bit]
                    outbox.append(req)

    def _vector(self, st: SetState) -> tuple[int, int, int]:
        """This rank's (flags, hit, absent). Bit b of `hit`: "I have cached request b pending (or joined)";
        of `absent`: "I do not have it". After the AND over ranks, hit & ~absent = ready and wanted by some
        rank."""
        flags = _ALL_FLAGS
        if st.outbox:
            flags &= ~_NO_NEW
        if st.id == 0 and self._state.closed:
            flags &= ~_NO_SHUTDOWN
        if st.abort:
            flags &= ~_NO_ABORT
        if st.overdue:
            flags &= ~_NO_TIMEOUT
        hit = _pack_bits(st.cached_wait, len(st.cached_wait))
        absent = hit ^ ((1 << 64 * st.cache.words) - 1)
        if st.local_join is not None:
            # A joined rank agrees to every cached op it is not itself waiting on through the table, and that
            # it can stand in for (allreduces): the others go through the table on the other ranks
            # (`_intake`), where they fail on every rank that submitted them.
            pending, cached = st.inflight, st.cache.signature
            agree = [
                b
                for b in st.cache.bits()
                if (sig := cached(b)).name not in pending and sig.op_type not in _NO_STAND_IN
            ]
            hit |= _pack_bits(agree, len(agree))
        return flags, hit, absent

    def negotiate(self, st: SetState, timeline: Timeline | None) -> tuple[list[Response], int]:
        """Steps 1 and 2 of the module docstring; returns (ready responses, agreed flags)."""
        now = time.monotonic()
        self._intake(st, timeline, now)
        flags, hit, absent = self._agree(st, *self._vector(st))
        return self.conclude(st, timeline, now, flags, hit, absent)

    def conclude(
        self, st: SetState, timeline: Timeline | None, now: float, flags: int, hit: int, absent: int
    ) -> tuple[list[Response], int]:
        """What follows the agreement (the ANDed flags, hit and absent words): the ready responses, the
        table's exchange and the stall check. Also the compiled lone cycle's way back into Python when the
        agreement is not the plain outcome it handles itself (engine/lone_cycle.py)."""
        if st.id == 0 and not flags & _NO_SHUTDOWN:
            return [], flags
        if not flags & _NO_TIMEOUT and st.unmatched is None:  # the table rank 0 judged, on every rank
            st.unmatched = unmatched.snapshot(st)
        ready = hit & ~absent
        responses: list[Response] = []
        if ready:
            ready_at = time.monotonic()
            bits = _unpack_bits(ready)  # in increasing order: the same order on every rank
            sigs = st.cache.signatures(bits)
            locals_ = list(map(st.cached_wait.pop, bits, repeat(None)))  # None: joined, neutral values
            columns = zip(sigs, locals_, repeat(None), repeat(None), repeat(ready_at), bits)
            responses = list(map(_response, columns))
        st.ready_key = (ready, st.cache.version, len(responses)) if ready else None
        self._state.stats["cache_hits"] += len(responses)
        if not flags & _NO_NEW:
            self._exchange(st, timeline, now)
        responses.extend(self._table_ready(st, timeline))
        if st.rank == 0 and now - st.last_stall_check > _STALL_CHECK_EVERY_S:
            st.last_stall_check = now
            self._stalls.check(st, now)
            st.overdue = st.overdue or unmatched.overdue(st, now, self._state.settings.collective_timeout_s)
        return responses, flags

    def _exchange(self, st: SetState, timeline: Timeline | None, now: float) -> None:
        """Allgather the new signatures (with how long each waited) into the identical table on every rank."""
        self._state.stats["exchanges"] += 1
        mine, st.outbox = st.outbox, []
        payload = [(req.sig, now - req.submitted_at) for req in mine]
        for req in mine:
            if req.sig.op_type is not _JOIN:
                st.announced[req.sig.name] = req
        # A set of one gathers its own list: no pickling round trip (the signatures are immutable tuples).
        gathered: list[list[tuple[Signature, float]]] = (
            [payload] if st.size == 1 else st.comm.allgather(payload)
        )
        for r, items in enumerate(gathered):
            for sig, waited in items:
                if sig.op_type is _JOIN:
                    if r not in st.joined:
                        st.joined.append(r)
                    continue
                bit = st.cache.evict(sig.name)  # someone announced it in full: the cached form is stale
                if bit is not None and bit in st.cached_wait:
                    st.outbox.append(st.cached_wait.pop(bit))
                entry = st.table.get(sig.name)
                if entry is None:
                    entry = st.table[sig.name] = Entry({}, now - waited)
                    if timeline is not None and sig.name not in st.negotiating:
                        st.negotiating.add(sig.name)
                        timeline.begin(sig.name, f"NEGOTIATE_{sig.op_type.name}", when=now - waited)
                entry.sigs[r] = sig
                entry.first_seen = min(entry.first_seen, now - waited)
                if timeline is not None:
                    timeline.instant(sig.name, f"rank {st.ranks[r]} ready", args={"rank": st.ranks[r]})

    def _table_ready(self, st: SetState, timeline: Timeline | None) -> list[Response]:
        if not st.table and not st.joined:
            return []
        everyone = set(range(st.size))
        joined = set(st.joined)
        out = []
        for name in list(st.table):
            entry = st.table[name]
            sig = entry.sigs[min(entry.sigs)]
            # An op joined ranks cannot stand in for fails at once, without waiting for the other ranks: it
            # would fail anyway, and a rank that joined early may have fewer unnamed ops behind it, so the
            # others' copies of this op can carry other names and would never meet (the table, and so this
            # decision, is the same on every rank).
            refused = bool(joined) and sig.op_type in _NO_STAND_IN
            if not refused and not set(entry.sigs) | joined >= everyone:
                continue
            del st.table[name]
            error = check_agreement(entry.sigs, st.ranks)
            if error is None and refused:
                error = self._join_refusal(st, sig, joined)
            out.append(Response(sig, st.announced.pop(name, None), error, None, time.monotonic()))
            self._state.stats["table_ready"] += 1
        if st.joined and len(joined) == st.size:
            last = st.ranks[st.joined[-1]]
            local = st.local_join
            st.joined.clear()
            st.local_join = None
            out.append(Response(Signature("join", _JOIN), local, None, last, time.monotonic()))
        return out

    @staticmethod
    def _join_refusal(st: SetState, sig: Signature, joined: set[int]) -> str:
        """The error for an op that ranks `joined` cannot stand in for, raised on every rank that submitted
        it (Horovod's rule and wording)."""
        who = ", ".join(str(st.ranks[r]) for r in sorted(joined))
        hint = (
            " (DistributedOptimizer: sparse_as_dense=True reduces sparse gradients by allreduce)"
            if sig.op_type is OpType.ALLGATHER
            else ""
        )
        op = sig.op_type.value
        return (
            f"{op} {sig.name!r}: {op} is not supported with join, and ranks {who} have joined; only "
            f"allreduce and barrier proceed until every rank has joined{hint}"
        )
