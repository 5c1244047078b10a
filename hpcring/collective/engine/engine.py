"""The background engine: one thread per process that negotiates, fuses and runs named collectives.

Framework calls `submit()` a Request and get a Handle back at once. Every `cycle_time_ms` the engine thread
runs one negotiation cycle per process set this rank belongs to (in increasing set id, so two sets can never
wait on each other), using only the set's own duplicated communicator and only from this thread (so a user's
MPI calls on their own communicators, from their own threads, never interleave with ours):

1. one allreduce (bitwise AND) of a few 64-bit words: flags ("I have new requests", "shut down", "stall
   abort") and, per response-cache bit, "I have this cached request pending" / "I do not have it"; requests
   every rank has pending with an identical cached signature are ready with no further exchange;
2. only when some rank has new (uncached) requests: one allgather of their small signatures; every rank adds
   them to an identical table; a name is ready when every rank (or every rank that has not joined) submitted
   it, and then it is validated: a disagreement becomes an error response, raised on every rank;
3. ready responses execute in the same order on every rank; consecutive compatible allreduces are packed into
   a persistent fusion buffer up to `fusion_threshold` bytes; data moves through `hpcring.collective`
   (validate=False: validation happened in step 2).

The table is identical on every rank, so stall detection (on the set's rank 0) can name the missing ranks;
cached requests that wait too long are re-announced through the table so they are reported too.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import math
import operator
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcring.collective import api, dtypes
from hpcring.collective.engine import phases
from hpcring.collective.engine.cache import ResponseCache
from hpcring.collective.engine.request import CACHEABLE, Handle, OpType, Request, Signature, complete
from hpcring.collective.engine.timeline import Timeline
from hpcring.collective.engine.validation import check_agreement
from hpcring.collective.ops import ReduceOp
from hpcring.config import EngineSettings
from hpcring.errors import CollectiveError, ConfigError

NDArray = np.ndarray[Any, Any]
log = logging.getLogger("hpcring.engine")

# Word 0 of the negotiation vector: flags stored inverted, so AND over ranks answers "does any rank ...?".
_NO_NEW = 1  # this rank has no uncached request to announce
_NO_SHUTDOWN = 2  # this rank does not ask to shut down
_NO_ABORT = 4  # this rank (the set's rank 0) does not ask to abort on a stall
_ALL_FLAGS = _NO_NEW | _NO_SHUTDOWN | _NO_ABORT
_IDLE_CYCLES_BEFORE_BACKOFF = 100
_IDLE_WAIT_S = 0.02
_STALL_CHECK_EVERY_S = 1.0
_SPIN_S = 200e-6
_MIN_BACKOFF_S = 50e-6
_MAX_BACKOFF_S = 500e-6
_REDUCE_OPS = {op.value: op for op in ReduceOp}  # by agreed name; Enum's by-value lookup is slow
_FEW_BITS = 16  # below this many bits, Python ints pack faster than numpy


@functools.lru_cache(maxsize=64)
def numpy_dtype(name: str) -> np.dtype[Any]:
    """numpy dtype from the agreed dtype name (bfloat16 comes from ml_dtypes)."""
    if name == "bfloat16":
        from hpcring.collective.arrays import bfloat16

        return bfloat16()
    return np.dtype(name)


def _neutral(op: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> NDArray:
    """What a joined rank contributes: zeros for Sum/Average (Horovod), the identity for Min/Max/Product."""
    if op == "min":
        fill: Any = (
            True if dtype == np.bool_ else (np.finfo(dtype).max if dtype.kind == "f" else np.iinfo(dtype).max)
        )
    elif op == "max":
        fill = (
            False
            if dtype == np.bool_
            else (np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min)
        )
    elif op == "product":
        fill = 1
    else:
        return np.zeros(shape, dtype=dtype)
    if dtype.name == "bfloat16":  # ml_dtypes' finfo
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        fill = info.max if op == "min" else (info.min if op == "max" else 1)
    return np.full(shape, fill, dtype=dtype)


@dataclass
class _Entry:
    """Negotiation-table row: which set ranks announced a name, with what signature."""

    sigs: dict[int, Signature]
    first_seen: float
    warned_at: float = 0.0


@dataclass(slots=True)
class Response:
    """One agreed operation of a cycle, identical on every rank of the set (except `local`)."""

    sig: Signature
    local: Request | None  # this rank's request; None when this rank joined and contributes neutral values
    error: str | None = None
    result: Any = None  # join: last joined rank
    ready_at: float = field(default_factory=time.monotonic)


class _SetState:
    """Everything the engine keeps for one process set this rank belongs to."""

    def __init__(self, set_id: int, ranks: Sequence[int], topology: Any, settings: EngineSettings) -> None:
        self.id = set_id
        self.ranks = tuple(ranks)  # world ranks, in set-rank order
        self.topology = topology
        self.comm = topology.comm
        self.rank: int = topology.rank
        self.size: int = topology.size
        self.cache = ResponseCache(settings.cache_capacity)
        self.inflight: dict[str, Request] = {}  # guarded by the engine lock (submit checks duplicates)
        self.incoming: list[Request] = []  # guarded by the engine lock
        self.outbox: list[Request] = []  # to announce through the table next cycle
        self.announced: dict[str, Request] = {}  # announced through the table, waiting
        self.cached_wait: dict[int, Request] = {}  # bit -> request waiting on the cache path
        self.table: dict[str, _Entry] = {}
        self.joined: list[int] = []  # set ranks, in the order their join became known
        self.local_join: Request | None = None
        self.abort = False  # set rank 0 decided to abort on a stall
        self.fusion = np.empty(0, dtype=np.uint8)
        self.last_stall_check = 0.0
        self.last_patience_scan = 0.0
        self.negotiating: set[str] = set()  # timeline: names with an open NEGOTIATE span

    def fusion_view(self, dtype: np.dtype[Any], count: int) -> NDArray:
        """`count` elements of `dtype` in the persistent fusion buffer (grown, never shrunk)."""
        need = count * dtype.itemsize
        if self.fusion.nbytes < need:
            self.fusion = np.empty(max(need, 2 * self.fusion.nbytes), dtype=np.uint8)
        return self.fusion[:need].view(dtype)


class Engine:
    """The per-process engine. Construct on the main thread (collective over the world); then use `submit`."""

    def __init__(
        self, world: Any, settings: EngineSettings, static_sets: Sequence[Sequence[int]] = ()
    ) -> None:
        from hpcring._deps import mpi

        self._mpi = mpi()
        self.settings = settings
        self.world_rank: int = world.rank
        self.world_size: int = world.size
        self._lock = threading.Lock()
        # Wake-up tokens for the engine thread: a C queue, so a submit wakes it with one hand-off (a Condition
        # would wake it while the submitter still holds the lock, costing a second switch).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._sets: dict[int, _SetState] = {}
        self._set_ranks: dict[int, tuple[int, ...]] = {}  # every registered set, member or not
        self._next_set_id = 1
        self._stop_reason: str | None = None
        self._stopped = threading.Event()
        self._closed = False
        self._cycle_no = 0
        self._idle_cycles = 0
        self._timeline: Timeline | None = None
        # Counters for tests and benchmarks (written by the engine thread only).
        self.stats = {
            "cycles": 0,
            "exchanges": 0,
            "cache_hits": 0,
            "table_ready": 0,
            "batches": 0,
            "fused": 0,
        }
        self._configure_logging()
        root = world.subset(range(world.size))  # the engine's own communicators, never the caller's
        self._register(0, tuple(range(world.size)), root)
        for ranks in static_sets:
            self._create_set(tuple(sorted(int(r) for r in ranks)))
        if settings.timeline:
            self.start_timeline(settings.timeline, settings.timeline_mark_cycles)
        self._thread = threading.Thread(target=self._run, name="hpcring-engine", daemon=True)
        self._thread.start()
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ public API (caller threads)

    def submit(self, req: Request) -> Handle:
        """Queue a request; ValueError for a name already in flight in its process set on this rank."""
        self.submit_many([req])
        return req.handle

    def submit_many(self, reqs: Sequence[Request]) -> None:
        """Queue requests atomically: they reach negotiation in the same cycle, so a group (e.g. a grouped
        allreduce) becomes ready, and is fused, together. Nothing is queued if any request is refused."""
        with self._lock:
            if self._closed or self._stopped.is_set():
                reason = self._stop_reason or "shutdown() called"
                raise CollectiveError(f"hpcring engine is shut down ({reason})")
            sets = self._sets
            seen: set[tuple[int, str]] = set()
            for req in reqs:
                sid, name = req.process_set_id, req.sig.name
                st = sets.get(sid) or self._member_state(sid)
                if name in st.inflight or (sid, name) in seen:
                    raise ValueError(
                        f"a collective named {name!r} is already in flight on this rank; wait for it "
                        "(synchronize) or use a different name"
                    )
                seen.add((sid, name))
            for req in reqs:
                st = sets[req.process_set_id]
                st.inflight[req.sig.name] = req
                st.incoming.append(req)
        self._wake.put(None)

    def _member_state(self, set_id: int) -> _SetState:
        st = self._sets.get(set_id)
        if st is not None:
            return st
        if set_id in self._set_ranks:
            raise ValueError(
                f"this rank ({self.world_rank}) is not a member of process set {set_id} "
                f"(ranks {list(self._set_ranks[set_id])})"
            )
        raise ValueError(f"process set {set_id} is not registered (removed, or never added)")

    def set_ranks(self, set_id: int) -> tuple[int, ...]:
        """World ranks of a registered process set."""
        with self._lock:
            if set_id not in self._set_ranks:
                raise ValueError(f"process set {set_id} is not registered (removed, or never added)")
            return self._set_ranks[set_id]

    def find_set(self, ranks: Sequence[int]) -> int | None:
        """Id of a registered set with exactly these ranks."""
        wanted = tuple(sorted(ranks))
        with self._lock:
            for sid, rs in self._set_ranks.items():
                if rs == wanted:
                    return sid
        return None

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Start writing a Chrome trace.

        One writer per job: the process with MPI_COMM_WORLD rank 0 (not the engine's rank 0, which every
        independent sub-communicator training has); with "{rank}" in the path every process writes its own
        file, named by its COMM_WORLD rank, so files never collide.
        """
        job_rank = self._mpi.COMM_WORLD.Get_rank()
        if "{rank}" not in path and job_rank != 0:
            return
        timeline = Timeline(path.replace("{rank}", str(job_rank)), mark_cycles=mark_cycles, rank=job_rank)
        with self._lock:
            old, self._timeline = self._timeline, timeline
        if old is not None:
            old.close()
        phases.set_listener(self._phase_listener)

    def stop_timeline(self) -> None:
        """Close the trace file (the JSON array is terminated so the file is valid JSON)."""
        with self._lock:
            old, self._timeline = self._timeline, None
        if old is not None:
            old.close()

    def shutdown(self, reason: str = "shutdown() called on this rank", timeout: float = 60.0) -> None:
        """Stop the engine on every rank (the request propagates in the next cycle), fail pending requests."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._stop_reason is None:
                self._stop_reason = reason
        self._wake.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("engine thread did not stop within %.0f s (a peer rank may have died)", timeout)
            return
        self.stop_timeline()
        phases.set_listener(None)
        for st in self._sets.values():
            st.topology.free()
        self._sets.clear()

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    # ------------------------------------------------------------------ process sets

    def _register(self, set_id: int, ranks: tuple[int, ...], topology: Any) -> None:
        self._set_ranks[set_id] = ranks
        if topology is not None:
            self._sets[set_id] = _SetState(set_id, ranks, topology, self.settings)

    def _create_set(self, ranks: tuple[int, ...]) -> int:
        """Register a set on every rank (members create its communicators); returns its id."""
        if not ranks or any(not 0 <= r < self.world_size for r in ranks) or len(set(ranks)) != len(ranks):
            raise ConfigError(
                f"process set ranks must be distinct ranks from 0 to {self.world_size - 1}, got {list(ranks)}"
            )
        set_id = self._next_set_id
        self._next_set_id += 1
        topo = self._sets[0].topology.subset(ranks) if self.world_rank in ranks else None
        with self._lock:
            self._register(set_id, ranks, topo)
        return set_id

    def _remove_set(self, set_id: int) -> None:
        with self._lock:
            st = self._sets.pop(set_id, None)
            self._set_ranks.pop(set_id, None)
        if st is not None:
            self._fail_set(st, f"process set {set_id} was removed while this request was pending")
            st.topology.free()

    # ------------------------------------------------------------------ the thread

    def _configure_logging(self) -> None:
        root = logging.getLogger("hpcring")
        level = {"trace": logging.DEBUG, "fatal": logging.CRITICAL}.get(self.settings.log_level)
        root.setLevel(level or getattr(logging, self.settings.log_level.upper()))
        if not root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter(f"[hpcring rank {self.world_rank}] %(levelname)s: %(message)s")
            )
            root.addHandler(handler)

    def _run(self) -> None:
        try:
            period = self.settings.cycle_time_ms / 1000.0
            while True:
                start = time.monotonic()
                if self._cycle():
                    break
                self._sleep(start, period)
        except BaseException as exc:  # the thread must never die silently: callers would wait forever
            log.exception("hpcring engine thread failed")
            self._stop_reason = f"engine thread failed: {exc!r}"
        finally:
            with self._lock:
                self._stopped.set()
                sets = list(self._sets.values())
            for st in sets:
                self._fail_set(st, f"hpcring shut down: {self._stop_reason or 'a rank shut down'}")

    def _sleep(self, start: float, period: float) -> None:
        """Wait for the next cycle.

        With requests in flight the next cycle starts `period` after this one (the fusion window: requests
        submitted meanwhile are negotiated together). With nothing in flight on this rank a submit wakes the
        thread at once, so a lone synchronous op does not pay the window; after many idle cycles the wait
        grows to _IDLE_WAIT_S (still woken by a submit) to leave the CPU to the training.
        """
        wake = self._wake
        while not wake.empty():  # tokens of submissions this cycle already took in
            wake.get_nowait()
        with self._lock:
            if self._closed:
                return
            if any(st.incoming for st in self._sets.values()):
                return
            locally_idle = not any(st.inflight for st in self._sets.values())
        if locally_idle:
            long_idle = self._idle_cycles > _IDLE_CYCLES_BEFORE_BACKOFF
            with contextlib.suppress(queue.Empty):  # a submit after the check above left a token: no wait
                wake.get(timeout=max(period, _IDLE_WAIT_S) if long_idle else period)
            return
        delay = start + period - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _agree(self, st: _SetState, vec: NDArray) -> None:
        """Bitwise-AND allreduce of the negotiation vector, polled instead of blocking.

        A blocking MPI call busy-polls; when ranks outnumber cores (or another rank is still computing) that
        spin steals the CPU the other ranks need. So: spin on Test() for _SPIN_S (peers that are already there
        answer in microseconds), then sleep with exponential backoff up to _MAX_BACKOFF_S between tests.
        """
        if st.size == 1:
            return  # the AND over one rank is the vector itself
        req = st.comm.Iallreduce(self._mpi.IN_PLACE, vec, op=self._mpi.BAND)
        deadline = time.monotonic() + _SPIN_S
        while time.monotonic() < deadline:
            if req.Test():
                return
        pause = _MIN_BACKOFF_S
        while not req.Test():
            time.sleep(pause)
            pause = min(pause * 2, _MAX_BACKOFF_S)

    def _cycle(self) -> bool:
        """One negotiation cycle over every set this rank is in; True when the engine must stop."""
        self._cycle_no += 1
        self.stats["cycles"] += 1
        timeline = self._timeline
        busy = False
        for set_id in sorted(self._sets):
            st = self._sets.get(set_id)
            if st is None:  # removed earlier in this cycle
                continue
            responses, flags, busy_here = self._negotiate(st, timeline)
            busy = busy or busy_here
            if set_id == 0 and not flags & _NO_SHUTDOWN:
                if self._stop_reason is None:
                    self._stop_reason = "another rank shut down hpcring (it called shutdown() or exited)"
                return True
            if not flags & _NO_ABORT:
                self._abort_stalled(st)
            if responses:
                if timeline is not None:
                    timeline.cycle(self._cycle_no)
                self._execute(st, responses, timeline)
        self._idle_cycles = 0 if busy else self._idle_cycles + 1
        return False

    # ------------------------------------------------------------------ negotiation

    def _intake(self, st: _SetState, timeline: Timeline | None, now: float) -> None:
        with self._lock:
            new, st.incoming = st.incoming, []
        lookup, cached_wait, outbox = st.cache.lookup, st.cached_wait, st.outbox
        for req in new:
            sig = req.sig
            if timeline is not None and sig.name not in st.negotiating:
                st.negotiating.add(sig.name)
                timeline.begin(sig.name, f"NEGOTIATE_{sig.op_type.name}", when=req.submitted_at)
            op = sig.op_type
            if op is OpType.JOIN:
                st.local_join = req
            elif op is OpType.ALLREDUCE or op in CACHEABLE:  # `is` first: hashing an Enum runs Python code
                bit = lookup(sig)
                if bit is not None:
                    cached_wait[bit] = req
                    continue
            outbox.append(req)
        # Cached requests waiting long go through the table, where the stall inspector can name missing ranks.
        # Scanned a few times per patience period, not every cycle (a fused step keeps hundreds cached).
        patience = self.settings.stall_check_time_s / 2
        scan_due = now - st.last_patience_scan > patience / 4
        if cached_wait and scan_due and not self.settings.stall_check_disable:
            st.last_patience_scan = now
            for bit, req in list(cached_wait.items()):
                if now - req.submitted_at > patience:
                    del cached_wait[bit]
                    outbox.append(req)

    def _vector(self, st: _SetState) -> NDArray:
        """[flags, hit words, absent words]. Bit b of `hit`: "I have cached request b pending (or joined)";
        of `absent`: "I do not have it". After the AND, hit & ~absent = ready and wanted by some rank.

        The bit sets are Python ints serialised little-endian: building and reading the vector costs a few
        byte conversions instead of a loop over words (and a bitwise AND does not care about byte order)."""
        nbytes = 8 * st.cache.words
        flags = _ALL_FLAGS
        if st.outbox:
            flags &= ~_NO_NEW
        if st.id == 0 and self._closed:
            flags &= ~_NO_SHUTDOWN
        if st.abort:
            flags &= ~_NO_ABORT
        hit = _pack_bits(st.cached_wait, len(st.cached_wait))
        absent = hit ^ ((1 << 8 * nbytes) - 1)
        if st.local_join is not None:
            # A joined rank agrees to every cached op it is not itself waiting on through the table.
            pending = st.inflight
            agree = [b for b in st.cache.bits() if st.cache.signature(b).name not in pending]
            hit |= _pack_bits(agree, len(agree))
        raw = flags.to_bytes(8, "little") + hit.to_bytes(nbytes, "little") + absent.to_bytes(nbytes, "little")
        return np.frombuffer(bytearray(raw), dtype=np.uint64)

    def _negotiate(self, st: _SetState, timeline: Timeline | None) -> tuple[list[Response], int, bool]:
        """Steps 1 and 2 of the module docstring; returns (ready responses, agreed flags, busy)."""
        now = time.monotonic()
        self._intake(st, timeline, now)
        vec = self._vector(st)
        self._agree(st, vec)
        raw = vec.tobytes()
        flags = int.from_bytes(raw[:8], "little")
        if st.id == 0 and not flags & _NO_SHUTDOWN:
            return [], flags, True
        nbytes = 8 * st.cache.words
        absent = int.from_bytes(raw[8 + nbytes :], "little")
        ready = int.from_bytes(raw[8 : 8 + nbytes], "little") & ~absent
        responses: list[Response] = []
        if ready:
            ready_at = time.monotonic()
            signature, pop = st.cache.signature, st.cached_wait.pop
            responses = [  # bits in increasing order: the same order on every rank
                Response(signature(b), pop(b, None), None, None, ready_at) for b in _unpack_bits(ready)
            ]
        self.stats["cache_hits"] += len(responses)
        if not flags & _NO_NEW:
            self._exchange(st, timeline, now)
        responses.extend(self._table_ready(st, timeline))
        if st.rank == 0 and now - st.last_stall_check > _STALL_CHECK_EVERY_S:
            st.last_stall_check = now
            self._check_stalls(st, now)
        busy = bool(responses or st.table or st.cached_wait or st.outbox or not flags & _NO_NEW)
        if nbytes and not busy:  # some rank has a cached request pending that this rank has not submitted
            busy = absent != (1 << 8 * nbytes) - 1
        return responses, flags, busy

    def _exchange(self, st: _SetState, timeline: Timeline | None, now: float) -> None:
        """Allgather the new signatures (with how long each waited) into the identical table on every rank."""
        self.stats["exchanges"] += 1
        mine, st.outbox = st.outbox, []
        payload = [(req.sig, now - req.submitted_at) for req in mine]
        for req in mine:
            if req.sig.op_type is not OpType.JOIN:
                st.announced[req.sig.name] = req
        gathered: list[list[tuple[Signature, float]]] = st.comm.allgather(payload)
        for r, items in enumerate(gathered):
            for sig, waited in items:
                if sig.op_type is OpType.JOIN:
                    if r not in st.joined:
                        st.joined.append(r)
                    continue
                bit = st.cache.evict(sig.name)  # someone announced it in full: the cached form is stale
                if bit is not None and bit in st.cached_wait:
                    st.outbox.append(st.cached_wait.pop(bit))
                entry = st.table.get(sig.name)
                if entry is None:
                    entry = st.table[sig.name] = _Entry({}, now - waited)
                    if timeline is not None and sig.name not in st.negotiating:
                        st.negotiating.add(sig.name)
                        timeline.begin(sig.name, f"NEGOTIATE_{sig.op_type.name}", when=now - waited)
                entry.sigs[r] = sig
                entry.first_seen = min(entry.first_seen, now - waited)
                if timeline is not None:
                    timeline.instant(sig.name, f"rank {st.ranks[r]} ready", args={"rank": st.ranks[r]})

    def _table_ready(self, st: _SetState, timeline: Timeline | None) -> list[Response]:
        if not st.table and not st.joined:
            return []
        everyone = set(range(st.size))
        joined = set(st.joined)
        out = []
        for name in list(st.table):
            entry = st.table[name]
            if not set(entry.sigs) | joined >= everyone:
                continue
            del st.table[name]
            error = check_agreement(entry.sigs, st.ranks)
            sig = entry.sigs[min(entry.sigs)]
            if error is None:
                error = self._join_conflict(st, sig, joined - set(entry.sigs))
            out.append(Response(sig, st.announced.pop(name, None), error))
            self.stats["table_ready"] += 1
        if st.joined and len(joined) == st.size:
            last = st.ranks[st.joined[-1]]
            local = st.local_join
            st.joined.clear()
            st.local_join = None
            out.append(Response(Signature("join", OpType.JOIN), local, None, last))
        return out

    @staticmethod
    def _join_conflict(st: _SetState, sig: Signature, absent: set[int]) -> str | None:
        """Ops joined ranks cannot stand in for."""
        if not absent:
            return None
        who = ", ".join(str(st.ranks[r]) for r in sorted(absent))
        if sig.op_type is OpType.BROADCAST and sig.root in absent:
            return f"broadcast of {sig.name!r}: root rank {st.ranks[sig.root]} has already joined"
        if sig.op_type in (
            OpType.ALLTOALL,
            OpType.BARRIER,
            OpType.ADD_PROCESS_SET,
            OpType.REMOVE_PROCESS_SET,
        ):
            return (
                f"{sig.op_type.value} {sig.name!r} cannot complete: ranks {who} have joined (only allreduce, "
                "allgather, broadcast and reducescatter accept joined ranks)"
            )
        return None

    def _check_stalls(self, st: _SetState, now: float) -> None:
        """Rank 0 of the set: warn about names some ranks submitted long ago; decide a stall abort."""
        s = self.settings
        if s.stall_check_disable:
            return
        lines = []
        for name, entry in st.table.items():
            age = now - entry.first_seen
            if age < s.stall_check_time_s:
                continue
            if s.stall_shutdown_time_s > 0 and age >= s.stall_shutdown_time_s:
                st.abort = True
            if now - entry.warned_at < s.stall_check_time_s:
                continue
            entry.warned_at = now
            have = sorted(st.ranks[r] for r in entry.sigs)
            missing = sorted(
                st.ranks[r] for r in range(st.size) if r not in entry.sigs and r not in st.joined
            )
            op = next(iter(entry.sigs.values())).op_type.value
            lines.append(
                f"  {name!r} ({op}, waiting {age:.0f} s): submitted by ranks {have}; missing ranks {missing}"
            )
        if lines:
            log.warning(
                "One or more tensors were submitted by a subset of ranks and have been waiting for the "
                "remaining ranks for more than %.0f s (process set %d). Different ranks may be submitting "
                "different tensors, or only some ranks are submitting, which would deadlock.\n"
                "Stalled tensors:\n%s",
                s.stall_check_time_s,
                st.id,
                "\n".join(lines),
            )
        if st.abort:
            log.error(
                "stall lasted more than %.0f s (HPCRING_STALL_SHUTDOWN_TIME_SECONDS): shutting hpcring down",
                s.stall_shutdown_time_s,
            )

    def _abort_stalled(self, st: _SetState) -> None:
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = (
                    f"a collective stalled for more than {self.settings.stall_shutdown_time_s:.0f} s in "
                    f"process set {st.id} (HPCRING_STALL_SHUTDOWN_TIME_SECONDS); rank {st.ranks[0]} logged "
                    "the stalled tensors"
                )
            self._closed = True

    # ------------------------------------------------------------------ execution

    def _execute(self, st: _SetState, responses: list[Response], timeline: Timeline | None) -> None:
        if timeline is not None:
            for r in responses:
                name = r.sig.name
                if name in st.negotiating:
                    st.negotiating.discard(name)
                    timeline.end(name, f"NEGOTIATE_{r.sig.op_type.name}", when=r.ready_at)
                timeline.begin(name, r.sig.op_type.name, when=r.ready_at)
                timeline.begin(name, "QUEUE", when=r.ready_at)
        for batch in plan_batches(responses, self.settings.fusion_threshold):
            self.stats["batches"] += 1
            if len(batch) > 1:
                self.stats["fused"] += len(batch)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, "QUEUE", when=now)
            self._run_batch(st, batch, timeline)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, r.sig.op_type.name, when=now)

    def _run_batch(self, st: _SetState, batch: list[Response], timeline: Timeline | None) -> None:
        first = batch[0]
        try:
            if first.error is not None:
                raise CollectiveError(first.error)
            op = first.sig.op_type
            if op is OpType.ALLREDUCE:
                results = self._allreduce(st, batch, timeline)
            else:
                results = [self._single(st, first, timeline)]
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, CollectiveError)
                else CollectiveError(f"{first.sig.op_type.value} of {first.sig.name!r} failed: {exc}")
            )
            if err is not exc:
                err.__cause__ = exc
            self._finish_many(st, batch, [None] * len(batch), err)
            return
        put, cached_wait = st.cache.put, st.cached_wait
        for r in batch:
            op = r.sig.op_type
            if op is OpType.ALLREDUCE or op in CACHEABLE:
                evicted = put(r.sig)
                if evicted is not None and evicted in cached_wait:
                    st.outbox.append(cached_wait.pop(evicted))
        self._finish_many(st, batch, results)

    def _finish_many(
        self, st: _SetState, batch: list[Response], results: list[Any], error: BaseException | None = None
    ) -> None:
        """Hand results (or the error) to this rank's requests; one lock round for the whole batch."""
        handles: list[Handle] = []
        kept: list[Any] = []
        inflight = st.inflight
        with self._lock:
            for r, result in zip(batch, results, strict=True):
                req = r.local
                if req is None:
                    continue
                if inflight.get(req.sig.name) is req:
                    del inflight[req.sig.name]
                handles.append(req.handle)
                kept.append(result)
        complete(handles, kept, error)

    def _reduce(self, st: _SetState, src: NDArray, dst: NDArray, sig: Signature) -> None:
        """dst = allreduce(src) with the agreed op and scale factors (dst may be src).

        Calls the collective library's algorithm entry point directly: the arguments were checked at submit
        and agreed in negotiation, so `hpcring.collective.allreduce`'s per-call checks would only add latency.
        """
        op = _REDUCE_OPS[sig.reduce_op]
        flat_src = src.reshape(-1)
        flat_dst = flat_src if dst is src else dst.reshape(-1)
        if sig.prescale != 1.0:
            if flat_dst is not flat_src:
                flat_dst[...] = flat_src
            dtypes.scale(flat_dst, sig.prescale)
            flat_src = flat_dst
        api.run_allreduce(st.topology, flat_src, flat_dst, op, self.settings.allreduce_algorithm)
        post = sig.postscale / st.size if op is ReduceOp.AVERAGE else sig.postscale
        if post != 1.0:
            dtypes.scale(flat_dst, post)

    def _allreduce(self, st: _SetState, batch: list[Response], timeline: Timeline | None) -> list[Any]:
        sig = batch[0].sig
        dtype = numpy_dtype(sig.dtype)
        names = [r.sig.name for r in batch] if timeline is not None else []
        if len(batch) == 1:
            req = batch[0].local
            src = (
                req.tensor
                if req is not None and req.tensor is not None
                else _neutral(sig.reduce_op, dtype, sig.shape)
            )
            dst = req.output if req is not None and req.output is not None else src
            with self._span(timeline, names, "COLLECTIVE"):
                self._reduce(st, src, dst, sig)
            return [dst]
        counts = list(map(math.prod, map(_SHAPE, (r.sig for r in batch))))  # allreduce shapes: no -1
        buf = st.fusion_view(dtype, sum(counts))
        with self._span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            parts: list[NDArray] = []
            for r, n in zip(batch, counts, strict=True):
                req = r.local
                tensor = req.tensor if req is not None else None
                parts.append(tensor if tensor is not None else _neutral(sig.reduce_op, dtype, (n,)))
            np.concatenate(parts, axis=None, out=buf)  # one C loop packs every tensor
        with self._span(timeline, names, "COLLECTIVE"):
            self._reduce(st, buf, buf, sig)
        results: list[Any] = []
        with self._span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            off = 0
            for r, n in zip(batch, counts, strict=True):
                req = r.local
                out = None if req is None else (req.output if req.output is not None else req.tensor)
                if out is not None:
                    np.copyto(out, buf[off : off + n].reshape(out.shape))
                results.append(out)
                off += n
        return results

    def _single(self, st: _SetState, r: Response, timeline: Timeline | None) -> Any:
        sig, req = r.sig, r.local
        topo = st.topology
        op = sig.op_type
        if op is OpType.JOIN:
            return r.result
        if op is OpType.BARRIER:
            return None  # readiness already proves every rank arrived
        if op is OpType.ADD_PROCESS_SET:
            return self._create_set(tuple(sig.extra))
        if op is OpType.REMOVE_PROCESS_SET:
            self._remove_set(sig.extra[0])
            return None
        dtype = numpy_dtype(sig.dtype)
        tensor = req.tensor if req is not None else None
        with self._span(timeline, [sig.name], "COLLECTIVE"):
            if op is OpType.ALLGATHER:
                src = tensor if tensor is not None else np.zeros((0, *sig.shape[1:]), dtype=dtype)
                return api.allgather(src, topology=topo, validate=False)
            if op is OpType.BROADCAST:
                buf = (
                    req.output
                    if req is not None and req.output is not None
                    else np.zeros(sig.shape, dtype=dtype)
                )
                api.broadcast(buf, sig.root, topology=topo, validate=False)
                return buf
            if op is OpType.ALLTOALL:
                assert req is not None and tensor is not None  # joined ranks are refused in negotiation
                splits = None if req.splits is None else req.splits
                return api.alltoall(tensor, splits, topology=topo, validate=False)
            if op is OpType.REDUCESCATTER:
                src = tensor if tensor is not None else np.zeros(sig.shape, dtype=dtype)
                if sig.prescale != 1.0:
                    src = src.copy()
                    dtypes.scale(src, sig.prescale)
                out = api.reducescatter(src, sig.reduce_op, topology=topo, validate=False)
                dtypes.scale(out, sig.postscale)
                return out
        raise CollectiveError(f"unknown operation {op!r}")

    @staticmethod
    def _span(timeline: Timeline | None, names: list[str], phase: str) -> Any:
        if timeline is None:
            return _NULL_SPAN
        phases.set_current(timeline, names)
        return timeline.span(names, phase)

    def _phase_listener(self, name: str, begin: bool) -> None:
        """Called by the collective algorithms (through `phases`) to nest their stages in the timeline."""
        timeline, names = phases.current()
        if timeline is None:
            return
        for n in names:
            (timeline.begin if begin else timeline.end)(n, name)

    def _fail_set(self, st: _SetState, message: str) -> None:
        with self._lock:
            pending = list(st.inflight.values())
            st.inflight.clear()
            st.incoming.clear()
        for req in pending:
            if not req.handle.done():
                req.handle.set_error(CollectiveError(f"{req.sig.op_type.value} {req.sig.name!r}: {message}"))


class _NullSpan:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


def plan_batches(responses: list[Response], limit: int) -> list[list[Response]]:
    """Group responses into batches run one after the other: compatible allreduces (same dtype, op, scale
    factors, device) fused up to `limit` bytes, looking ahead over allreduces only (never past another op, so
    e.g. a barrier keeps its place). Deterministic, so every rank forms the same batches."""
    if limit <= 0 or len(responses) == 1:
        return [[r] for r in responses]
    n = len(responses)
    sigs = [r.sig for r in responses]
    keys = list(map(_FUSION_KEY, sigs))
    if (  # the steady state, one group of like allreduces: decided with C-level passes over the lists
        keys.count(keys[0]) == n
        and list(map(_OP_TYPE, sigs)).count(OpType.ALLREDUCE) == n
        and [r.error for r in responses].count(None) == n
        and _itemsize(sigs[0].dtype) * sum(map(math.prod, map(_SHAPE, sigs))) <= limit
    ):
        return [list(responses)]
    # Per response, computed once: its fusion key (None when it never fuses) and size; a look-ahead stops at
    # the first response that is not an allreduce.
    allreduce = [s.op_type is OpType.ALLREDUCE for s in sigs]
    fusable = [
        k if ar and r.error is None else None for r, k, ar in zip(responses, keys, allreduce, strict=True)
    ]
    sizes = [_nbytes(r.sig) if k is not None else 0 for r, k in zip(responses, fusable, strict=True)]
    batches: list[list[Response]] = []
    used = [False] * n
    for i, r in enumerate(responses):
        if used[i]:
            continue
        used[i] = True
        batch = [r]
        key = fusable[i]
        if key is not None:
            total = sizes[i]
            for j in range(i + 1, n):
                if not allreduce[j]:
                    break
                if used[j] or fusable[j] != key or total + sizes[j] > limit:
                    continue
                used[j] = True
                batch.append(responses[j])
                total += sizes[j]
        batches.append(batch)
    return batches


def _shutdown_at_exit(ref: weakref.ref[Engine]) -> None:
    """Stop a running engine when the interpreter exits, so peers see the shutdown instead of hanging."""
    engine = ref()
    if engine is not None:
        engine.shutdown("this rank's process is exiting", timeout=10.0)


# Signature fields read in bulk with C-level getters (NamedTuple positions): what must match to fuse
# (dtype, reduce op, prescale, postscale, device), the op type and the shape.
_FUSION_KEY = operator.itemgetter(
    *(Signature._fields.index(f) for f in ("dtype", "reduce_op", "prescale", "postscale", "device"))
)
_OP_TYPE = operator.itemgetter(Signature._fields.index("op_type"))
_SHAPE = operator.itemgetter(Signature._fields.index("shape"))


def _nbytes(sig: Signature) -> int:
    return sig.numel * _itemsize(sig.dtype)


def _itemsize(dtype: str) -> int:
    size = _itemsizes.get(dtype)
    if size is None:
        size = _itemsizes[dtype] = numpy_dtype(dtype).itemsize
    return size


_itemsizes: dict[str, int] = {}  # by agreed dtype name (a dict lookup is cheaper than the lru_cache call)


def _pack_bits(bits: Iterable[int], n: int) -> int:
    """The int with the given `n` bit positions set (numpy for many bits: one C pass instead of n big-int
    operations)."""
    if n <= _FEW_BITS:
        mask = 0
        for b in bits:
            mask |= 1 << b
        return mask
    positions = np.fromiter(bits, dtype=np.intp, count=n)
    flags = np.zeros(int(positions.max()) + 1, dtype=np.uint8)
    flags[positions] = 1
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def _unpack_bits(mask: int) -> list[int]:
    """Positions of the set bits of `mask`, in increasing order."""
    if mask.bit_count() <= _FEW_BITS:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out
    raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    positions: list[int] = np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
    return positions
