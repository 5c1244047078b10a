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
import dataclasses
import functools
import itertools
import logging
import math
import operator
import queue
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from hpcring.collective import api, dtypes
from hpcring.collective.algorithms.ring import DEFAULT_CHUNK_BYTES
from hpcring.collective.algorithms.shm import SLOT_ENV, shm_round, slot_limit
from hpcring.collective.engine import phases
from hpcring.collective.engine.cache import ResponseCache
from hpcring.collective.engine.device import ROUTES as DEVICE_ROUTES
from hpcring.collective.engine.device import DevicePlane
from hpcring.collective.engine.request import CACHEABLE, Handle, OpType, Request, Signature, complete
from hpcring.collective.engine.request import drain as _drain
from hpcring.collective.engine.timeline import NULL_SPAN, Timeline
from hpcring.collective.engine.validation import check_agreement
from hpcring.collective.ops import ReduceOp
from hpcring.collective.progress import wait_polled
from hpcring.collective.selection import CHUNK_ENV, SEGMENT_ENV, chunk_bytes, segment_bytes
from hpcring.config import ALGORITHMS, EngineSettings
from hpcring.errors import CollectiveError, ConfigError, choices

NDArray = np.ndarray[Any, Any]
log = logging.getLogger("hpcring.engine")

# Word 0 of the negotiation vector: flags stored inverted, so AND over ranks answers "does any rank ...?".
_NO_NEW = 1  # this rank has no uncached request to announce
_NO_SHUTDOWN = 2  # this rank does not ask to shut down
_NO_ABORT = 4  # this rank (the set's rank 0) does not ask to abort on a stall
_ALL_FLAGS = _NO_NEW | _NO_SHUTDOWN | _NO_ABORT
_IDLE_WAIT_S = 0.02
_STALL_CHECK_EVERY_S = 1.0
_REDUCE_OPS = {op.value: op for op in ReduceOp}  # by agreed name; Enum's by-value lookup is slow
SHM_FUSED_MIN_BYTES = 64 << 10  # smaller fused batches: MPI's latency beats two node barriers
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
    if dtype.name == "bfloat16" and op in ("min", "max", "product"):  # ml_dtypes: kind 'V', its own finfo
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        return np.full(shape, info.max if op == "min" else (info.min if op == "max" else 1), dtype=dtype)
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
    return np.full(shape, fill, dtype=dtype)


@dataclass
class _Entry:
    """Negotiation-table row: which set ranks announced a name, with what signature."""

    sigs: dict[int, Signature]
    first_seen: float
    warned_at: float = 0.0


class Response(NamedTuple):
    """One agreed operation of a cycle, identical on every rank of the set (except `local`).

    A NamedTuple: a steady-state cycle builds one per cached tensor, in C (`_response`) from zipped columns.
    """

    sig: Signature
    local: Request | None  # this rank's request; None when this rank joined and contributes neutral values
    error: str | None = None
    result: Any = None  # join: last joined rank
    ready_at: float = 0.0  # when negotiation found it ready (timeline)
    bit: int = -1  # response-cache position it was taken from; -1 when it came through the table


_Plan = list[list[int]]  # batches as positions in a cycle's responses (`plan_indices`)

# Response from a (sig, local, error, result, ready_at, bit) tuple without a Python-level __new__.
_response = functools.partial(tuple.__new__, Response)


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
        # (ready bits, cache version, count) of this cycle's cached responses; the plan made for such a key
        self.ready_key: tuple[int, int, int] | None = None
        self.plan_memo: tuple[tuple[int, int, int], _Plan, list[list[int] | None]] | None = None

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

        nodes = len(world.node_sizes)
        if settings.allreduce_algorithm == "shm" and nodes > 1:  # said here, on every rank, not mid-training
            raise ConfigError(
                f"HPCRING_ALLREDUCE_ALGORITHM=shm needs every rank on one node, but this job spans {nodes} "
                f"nodes; allowed here: {choices(a for a in ALGORITHMS if a != 'shm')}"
            )
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
        self._tunes = 0  # Engine.tune calls on this rank: numbers their names
        self._timeline: Timeline | None = None
        self._chunk = chunk_bytes(DEFAULT_CHUNK_BYTES)  # ring pipelining chunk, read once
        self._shm_slot = slot_limit()  # largest fused batch through shared memory, read once
        _check_settings_agree(world.comm, settings, self._chunk, self._shm_slot)
        self._buffer = self._mpi.buffer  # an array's memory: address, size, read-only flag (zero-copy check)
        self._device: DevicePlane | None = None  # batches of device tensors (device.py), built on first use
        # Counters for tests and benchmarks (written by the engine thread only).
        self.stats = {
            "cycles": 0,
            "exchanges": 0,
            "cache_hits": 0,
            "table_ready": 0,
            "batches": 0,
            "fused": 0,
            "no_pack": 0,  # fused batches reduced straight from the callers' adjacent inputs
            "no_unpack": 0,  # fused batches reduced straight into the callers' adjacent outputs
            "shm": 0,  # fused batches reduced through the node's shared-memory segment
            "tunes": 0,  # Engine.tune requests applied
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
        name = req.sig.name
        with self._lock:
            if self._closed or self._stopped.is_set():
                raise self._shut_down()
            st = self._sets.get(req.process_set_id) or self._member_state(req.process_set_id)
            if name in st.inflight:
                raise _duplicate(name)
            st.inflight[name] = req
            st.incoming.append(req)
        self._wake.put(None)
        return req.handle

    def submit_many(self, reqs: Sequence[Request]) -> None:
        """Queue requests atomically: they reach negotiation in the same cycle, so a group (e.g. a grouped
        allreduce) becomes ready, and is fused, together. Nothing is queued if any request is refused."""
        names = list(map(_SIG_NAME, reqs))
        set_ids = list(map(_REQ_SET, reqs))
        with self._lock:
            if self._closed or self._stopped.is_set():
                raise self._shut_down()
            if names and set_ids.count(set_ids[0]) == len(set_ids):  # one set: C-level checks and inserts
                st = self._sets.get(set_ids[0]) or self._member_state(set_ids[0])
                inflight = st.inflight
                if len(set(names)) != len(names) or not inflight.keys().isdisjoint(names):
                    raise _duplicate(_first_duplicate(names, inflight))
                inflight.update(zip(names, reqs, strict=True))
                st.incoming.extend(reqs)
            else:
                self._submit_mixed(reqs, names, set_ids)
        self._wake.put(None)

    def _shut_down(self) -> CollectiveError:
        return CollectiveError(f"hpcring engine is shut down ({self._stop_reason or 'shutdown() called'})")

    def _submit_mixed(self, reqs: Sequence[Request], names: list[str], set_ids: list[int]) -> None:
        """submit_many for requests of several process sets (engine lock held)."""
        sets = self._sets
        seen: set[tuple[int, str]] = set()
        for sid, name in zip(set_ids, names, strict=True):
            st = sets.get(sid) or self._member_state(sid)
            if name in st.inflight or (sid, name) in seen:
                raise _duplicate(name)
            seen.add((sid, name))
        for req, sid, name in zip(reqs, set_ids, names, strict=True):
            st = sets[sid]
            st.inflight[name] = req
            st.incoming.append(req)

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

    def tune(self, fusion_threshold: int | None = None, cycle_time_ms: float | None = None) -> Handle:
        """Change the fusion threshold (bytes) and cycle time (ms) of the running engine: the hook an
        autotuner drives. Collective over the global set, negotiated like any op: every rank calls it (the
        same number of times, in its op sequence), and the values of the global set's rank 0 are applied
        on every rank when the request executes, so batches planned after it use the new threshold on every
        rank (the fusion layout must agree) and batches planned before it the old one. Other ranks may pass
        None. None on rank 0 keeps that setting. The handle's result is the (fusion_threshold,
        cycle_time_ms) now in force. ValueError for a negative value."""
        for what, value in (("fusion_threshold", fusion_threshold), ("cycle_time_ms", cycle_time_ms)):
            if value is not None and (isinstance(value, bool) or not value >= 0):
                raise ValueError(f"Engine.tune: {what} must be a number >= 0 or None, got {value!r}")
        with self._lock:
            self._tunes += 1
            name = f"engine.tune.{self._tunes}"
        extra = (
            -1 if fusion_threshold is None else int(fusion_threshold),
            -1 if cycle_time_ms is None else round(cycle_time_ms * 1000),
        )
        return self.submit(Request(Signature(name, OpType.TUNE, extra=extra), 0))

    def _apply_tuning(self, extra: tuple[int, ...]) -> tuple[int, float]:
        """Engine thread, executing an agreed TUNE response: the new settings, and forget remembered fusion
        plans (they were made with the old threshold)."""
        threshold, cycle_us = extra
        changes: dict[str, Any] = {}
        if threshold >= 0:
            changes["fusion_threshold"] = threshold
        if cycle_us >= 0:
            changes["cycle_time_ms"] = cycle_us / 1000
        self.settings = dataclasses.replace(self.settings, **changes)
        for st in self._sets.values():
            st.plan_memo = None
        self.stats["tunes"] += 1
        return self.settings.fusion_threshold, self.settings.cycle_time_ms

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
        if self._device is not None:
            self._device.close()
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
            if self._device is not None:
                self._device.release(set_id)
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
            while True:
                start = time.monotonic()
                if self._cycle():
                    break
                self._sleep(start, self.settings.cycle_time_ms / 1000.0)  # Engine.tune may change it
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
        submitted meanwhile are negotiated together). With nothing in flight on this rank the thread waits for
        a submit, which wakes it at once (a lone synchronous op does not pay the window), or _IDLE_WAIT_S at
        most (shutdown and stall checks). It does not run idle cycles on the `period` clock: nothing a peer
        waits for can complete before this rank submits it, and an idle cycle that happens to start just
        before a submission pairs (negotiation is collective, cycle by cycle) with a peer's cycle that
        carries the request, which then waits a whole period for the next one.
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
            with contextlib.suppress(queue.Empty):  # a submit after the check above left a token: no wait
                wake.get(timeout=max(period, _IDLE_WAIT_S))
            return
        delay = start + period - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _agree(self, st: _SetState, flags: int, hit: int, absent: int) -> tuple[int, int, int]:
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
        wait_polled(st.comm.Iallreduce(self._mpi.IN_PLACE, vec, op=self._mpi.BAND))
        raw = vec.tobytes()
        return (
            int.from_bytes(raw[:8], "little"),
            int.from_bytes(raw[8 : 8 + nbytes], "little"),
            int.from_bytes(raw[8 + nbytes :], "little"),
        )

    def _cycle(self) -> bool:
        """One negotiation cycle over every set this rank is in; True when the engine must stop."""
        self._cycle_no += 1
        self.stats["cycles"] += 1
        timeline = self._timeline
        for set_id in sorted(self._sets):
            st = self._sets.get(set_id)
            if st is None:  # removed earlier in this cycle
                continue
            responses, flags = self._negotiate(st, timeline)
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
        return False

    # ------------------------------------------------------------------ negotiation

    def _intake(self, st: _SetState, timeline: Timeline | None, now: float) -> None:
        with self._lock:
            new, st.incoming = st.incoming, []
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

    def _vector(self, st: _SetState) -> tuple[int, int, int]:
        """This rank's (flags, hit, absent). Bit b of `hit`: "I have cached request b pending (or joined)";
        of `absent`: "I do not have it". After the AND over ranks, hit & ~absent = ready and wanted by some
        rank."""
        flags = _ALL_FLAGS
        if st.outbox:
            flags &= ~_NO_NEW
        if st.id == 0 and self._closed:
            flags &= ~_NO_SHUTDOWN
        if st.abort:
            flags &= ~_NO_ABORT
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

    def _negotiate(self, st: _SetState, timeline: Timeline | None) -> tuple[list[Response], int]:
        """Steps 1 and 2 of the module docstring; returns (ready responses, agreed flags)."""
        now = time.monotonic()
        self._intake(st, timeline, now)
        flags, hit, absent = self._agree(st, *self._vector(st))
        if st.id == 0 and not flags & _NO_SHUTDOWN:
            return [], flags
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
        self.stats["cache_hits"] += len(responses)
        if not flags & _NO_NEW:
            self._exchange(st, timeline, now)
        responses.extend(self._table_ready(st, timeline))
        if st.rank == 0 and now - st.last_stall_check > _STALL_CHECK_EVERY_S:
            st.last_stall_check = now
            self._check_stalls(st, now)
        return responses, flags

    def _exchange(self, st: _SetState, timeline: Timeline | None, now: float) -> None:
        """Allgather the new signatures (with how long each waited) into the identical table on every rank."""
        self.stats["exchanges"] += 1
        mine, st.outbox = st.outbox, []
        payload = [(req.sig, now - req.submitted_at) for req in mine]
        for req in mine:
            if req.sig.op_type is not _JOIN:
                st.announced[req.sig.name] = req
        gathered: list[list[tuple[Signature, float]]] = st.comm.allgather(payload)
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
            self.stats["table_ready"] += 1
        if st.joined and len(joined) == st.size:
            last = st.ranks[st.joined[-1]]
            local = st.local_join
            st.joined.clear()
            st.local_join = None
            out.append(Response(Signature("join", _JOIN), local, None, last, time.monotonic()))
        return out

    @staticmethod
    def _join_refusal(st: _SetState, sig: Signature, joined: set[int]) -> str:
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
        plan, counts = self._plan(st, responses)
        for idx, batch_counts in zip(plan, counts, strict=True):
            batch = responses if len(idx) == len(responses) else list(map(responses.__getitem__, idx))
            self.stats["batches"] += 1
            if len(batch) > 1:
                self.stats["fused"] += len(batch)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, "QUEUE", when=now)
            self._run_batch(st, batch, timeline, batch_counts)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, r.sig.op_type.name, when=now)

    def _plan(self, st: _SetState, responses: list[Response]) -> tuple[_Plan, list[list[int] | None]]:
        """`plan_indices` and, per batch, the element count of each tensor (None: not known in advance).

        Remembered for a repeated set of cached responses: a training step's gradients come back ready
        together step after step, and the plan depends only on their signatures, which the ready bits and the
        cache's version identify."""
        key = st.ready_key
        if key is None or len(responses) != key[2]:  # table responses too: plan afresh
            plan = plan_indices(responses, self.settings.fusion_threshold)
            return plan, [None] * len(plan)
        memo = st.plan_memo
        if memo is not None and memo[0] == key:
            return memo[1], memo[2]
        plan = plan_indices(responses, self.settings.fusion_threshold)
        sigs = list(map(_SIG, responses))
        counts: list[list[int] | None] = [
            list(map(math.prod, map(_SHAPE, map(sigs.__getitem__, idx)))) for idx in plan
        ]
        st.plan_memo = (key, plan, counts)
        return plan, counts

    def _run_batch(
        self,
        st: _SetState,
        batch: list[Response],
        timeline: Timeline | None,
        counts: list[int] | None = None,
    ) -> None:
        first = batch[0]
        err: CollectiveError | None = None
        results: list[Any] = [None] * len(batch)
        try:
            if first.error is not None:
                raise CollectiveError(first.error)
            op = first.sig.op_type
            if first.sig.device in DEVICE_ROUTES:  # torch tensors on a device: the device plane, never numpy
                self._device = self._device or DevicePlane(self.settings)
                results = self._device.run(st.id, st.topology, batch, timeline)
            elif op is _ALLREDUCE:
                results = self._allreduce(st, batch, timeline, counts)
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
        if first.error is None:
            # Executed here, whether it succeeded or failed (other ranks may have succeeded and recorded it):
            # the cache's bits must mean the same names on every rank.
            self._remember(st, batch)
        self._finish_many(st, batch, results, err)

    @staticmethod
    def _remember(st: _SetState, batch: list[Response]) -> None:
        """Record an executed batch in the response cache, in execution order (identical on every rank).

        A batch is either one response or allreduces only (`plan_batches`), so the first op decides. Responses
        that came from the cache are refreshed with one C-level pass; the rest are put one by one, and a
        request waiting on a bit that a put evicted renegotiates through the table."""
        op = batch[0].sig.op_type
        if op is not _ALLREDUCE and op not in CACHEABLE:
            return
        if len(batch) > 1:
            bits = list(map(_BIT, batch))
            version = -1 if st.ready_key is None else st.ready_key[1]  # when these responses were read
            if -1 not in bits and st.cache.touch(bits, list(map(_SIG, batch)), version):
                return
        put, cached_wait = st.cache.put, st.cached_wait
        for r in batch:
            evicted = put(r.sig)
            if evicted is not None and evicted in cached_wait:
                st.outbox.append(cached_wait.pop(evicted))

    def _finish_many(
        self, st: _SetState, batch: list[Response], results: list[Any], error: BaseException | None = None
    ) -> None:
        """Hand results (or the error) to this rank's requests: one lock round, C-level passes."""
        if len(batch) == 1:  # the latency path: no lists
            req = batch[0].local
            if req is not None:
                with self._lock:
                    if st.inflight.get(req.sig.name) is req:
                        del st.inflight[req.sig.name]
                complete((req.handle,), results, error)
            return
        reqs: list[Any] = list(map(_LOCAL, batch))
        if None in reqs:  # joined: this rank has no request for those
            kept = [(q, res) for q, res in zip(reqs, results, strict=True) if q is not None]
            reqs, results = [q for q, _ in kept], [res for _, res in kept]
        names = list(map(_SIG_NAME, reqs))
        inflight = st.inflight
        with self._lock:
            popped = list(map(inflight.pop, names, repeat(None)))
            if popped != reqs:  # an entry that is not this request (defensive): put it back
                for name, was, req in zip(names, popped, reqs, strict=True):
                    if was is not None and was is not req:
                        inflight[name] = was
        complete(list(map(_HANDLE, reqs)), results, error)

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
        api.run_allreduce(st.topology, flat_src, flat_dst, op, self.settings.allreduce_algorithm, self._chunk)
        post = _postscale(sig, op, st.size)
        if post != 1.0:
            dtypes.scale(flat_dst, post)

    def _allreduce(
        self, st: _SetState, batch: list[Response], timeline: Timeline | None, counts: list[int] | None = None
    ) -> list[Any]:
        sig = batch[0].sig
        dtype = numpy_dtype(sig.dtype)
        names = list(map(_SIG_NAME, batch)) if timeline is not None else []
        reqs: list[Any] = list(map(_LOCAL, batch))
        if len(batch) == 1 and reqs[0] is not None and reqs[0].tensor is not None:
            req = reqs[0]
            dst = req.output if req.output is not None else req.tensor
            with self._span(timeline, names, "COLLECTIVE"):
                self._reduce(st, req.tensor, dst, sig)
            return [dst]
        if counts is None:
            counts = list(map(math.prod, map(_SHAPE, map(_SIG, batch))))  # allreduce shapes: no -1
        if None in reqs:
            return self._allreduce_joined(st, batch, reqs, counts, dtype, timeline, names)
        tensors: list[Any] = list(map(_TENSOR, reqs))
        outputs: list[Any] = list(map(_OUTPUT, reqs))
        if any(map(_is_none, outputs)):  # not `None in`: that would compare array elements
            outputs = [t if o is None else o for t, o in zip(tensors, outputs, strict=True)]
        if any(map(_is_none, tensors)):
            return self._allreduce_joined(st, batch, reqs, counts, dtype, timeline, names)
        src, dst = self._zero_copy_views(tensors, outputs, dtype)
        if src is not None and dst is not None:  # adjacent views: reduced where they are
            self.stats["no_pack"] += 1
            self.stats["no_unpack"] += 1
            with self._span(timeline, names, "COLLECTIVE"):
                self._reduce(st, src, dst, sig)
            return outputs
        if st.size == 1 and sig.prescale == 1.0:
            return self._allreduce_alone(tensors, outputs, sig)
        if self._shared_memory_batch(st, tensors, outputs, counts, dtype, sig, timeline, names):
            return outputs  # (an adjacent side is copied into or out of the slot like any other)
        self.stats["no_pack"] += src is not None
        self.stats["no_unpack"] += dst is not None
        buf = st.fusion_view(dtype, sum(counts))
        if src is None:
            with self._span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
                np.concatenate(tensors, axis=None, out=buf)  # one C loop packs every tensor
        with self._span(timeline, names, "COLLECTIVE"):
            self._reduce(st, buf if src is None else src, buf if dst is None else dst, sig)
        if dst is None:
            with self._span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
                _unpack(buf, counts, outputs)
        return outputs

    @staticmethod
    def _allreduce_alone(tensors: list[NDArray], outputs: list[NDArray], sig: Signature) -> list[Any]:
        """A fused batch in a set of one rank: the reduction is the input itself, so each output gets one copy
        of its input (none in place) instead of a trip through the fusion buffer, then the scale factor."""
        for t, out in zip(tensors, outputs, strict=True):
            if out is not t:
                out[...] = t.reshape(out.shape)
        if sig.postscale != 1.0:  # AVERAGE over one rank divides by one
            for out in outputs:
                dtypes.scale(out, sig.postscale)
        return outputs

    def _shared_memory_batch(
        self,
        st: _SetState,
        tensors: list[NDArray],
        outputs: list[NDArray],
        counts: list[int],
        dtype: np.dtype[Any],
        sig: Signature,
        timeline: Timeline | None,
        names: list[str],
    ) -> bool:
        """Reduce a fused batch of separate tensors through the node's shared-memory segment (`shm`): packed
        straight into this rank's slot, unpacked straight from the reduced result, so the data is copied
        twice instead of four times (into and out of the fusion buffer, and MPI's own copies). For sets on
        one node, with the algorithm left to `auto` (or set to `shm`), batches from SHM_FUSED_MIN_BYTES up to
        one slot. False, with nothing done, where it does not apply: the caller packs and runs the ring."""
        algorithm = self.settings.allreduce_algorithm
        total = sum(counts)
        nbytes = total * dtype.itemsize
        if (
            algorithm not in ("auto", "shm")
            or (algorithm == "auto" and nbytes < SHM_FUSED_MIN_BYTES)
            or sig.prescale != 1.0
            or nbytes > self._shm_slot
        ):
            return False
        seg = st.topology.shared_segment()
        if seg is None or not seg.ensure(nbytes):
            return False
        op = _REDUCE_OPS[sig.reduce_op]
        post = _postscale(sig, op, st.size)

        def fill(slot: NDArray) -> None:
            with self._span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
                np.concatenate(tensors, axis=None, out=slot)

        def drain(result: NDArray) -> None:
            with self._span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
                _unpack(result, counts, outputs)

        finish = None if post == 1.0 else functools.partial(dtypes.scale, factor=post)
        with self._span(timeline, names, "COLLECTIVE"):
            shm_round(seg, total, dtype, op, fill, drain, finish)
        self.stats["shm"] += 1
        return True

    def _zero_copy_views(
        self, tensors: list[NDArray], outputs: list[NDArray], dtype: np.dtype[Any]
    ) -> tuple[Any, Any]:
        """(input region, output region) as single arrays of `dtype` where a batch's tensors (outputs) lie
        back to back in memory, else None for that side, which then goes through the fusion buffer.

        Gradients laid out as views of one flat buffer (DDP's `gradient_as_bucket_view`, or any caller that
        allocates a group in one piece) are then reduced where they are: no pack, no unpack. In place (every
        output is its input) gives one region for both; regions that overlap otherwise are not used (MPI
        forbids aliased send and receive buffers). Only regions written in place must be writeable."""
        in_place = all(map(operator.is_, outputs, tensors))
        span_in = _adjacent_span(tensors, self._buffer, writeable=in_place)
        if span_in is not None and span_in[1].dtype != dtype:
            span_in = None
        if in_place:
            return (span_in[1], span_in[1]) if span_in is not None else (None, None)
        span_out = _adjacent_span(outputs, self._buffer, writeable=True)
        if span_out is not None and span_out[1].dtype != dtype:
            span_out = None
        if span_in is not None and span_out is not None:
            (a, src), (b, dst) = span_in, span_out
            if src.nbytes != dst.nbytes:
                return None, None  # outputs not shaped like the inputs: let the copies say so
            if a == b:
                return src, src  # the same memory: in place
            if a < b + dst.nbytes and b < a + src.nbytes:
                return None, None  # partial overlap: pack and unpack
            return src, dst
        return (
            None if span_in is None else span_in[1],
            None if span_out is None else span_out[1],
        )

    def _allreduce_joined(
        self,
        st: _SetState,
        batch: list[Response],
        reqs: list[Request | None],
        counts: list[int],
        dtype: np.dtype[Any],
        timeline: Timeline | None,
        names: list[str],
    ) -> list[Any]:
        """A fused batch where this rank contributes neutral values for some tensors (it joined). The prescale
        applies to this rank's own tensors only: a scaled neutral value (1 x 2 for Product, the largest value
        x -1 for Min) would no longer be neutral."""
        sig = batch[0].sig
        buf = st.fusion_view(dtype, sum(counts))
        with self._span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            parts: list[NDArray] = []
            own: list[tuple[int, int]] = []
            off = 0
            for req, n in zip(reqs, counts, strict=True):
                tensor = req.tensor if req is not None else None
                parts.append(tensor if tensor is not None else _neutral(sig.reduce_op, dtype, (n,)))
                if tensor is not None:
                    own.append((off, off + n))
                off += n
            np.concatenate(parts, axis=None, out=buf)
            if sig.prescale != 1.0:
                for lo, hi in own:
                    dtypes.scale(buf[lo:hi], sig.prescale)
        with self._span(timeline, names, "COLLECTIVE"):
            self._reduce(st, buf, buf, sig._replace(prescale=1.0))
        results: list[Any] = []
        with self._span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            off = 0
            for req, n in zip(reqs, counts, strict=True):
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
        if op is OpType.TUNE:
            return self._apply_tuning(sig.extra)
        assert req is not None and req.tensor is not None  # joined ranks are refused in negotiation
        tensor = req.tensor
        with self._span(timeline, [sig.name], "COLLECTIVE"):
            if op is OpType.ALLGATHER:
                return api.allgather(tensor, topology=topo, validate=False)
            if op is OpType.BROADCAST:
                buf = req.output if req.output is not None else tensor
                api.broadcast(buf, sig.root, topology=topo, validate=False)
                return buf
            if op is OpType.ALLTOALL:
                return api.alltoall(tensor, req.splits, topology=topo, validate=False)
            if op is OpType.REDUCESCATTER:
                src = tensor
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
            return NULL_SPAN
        phases.set_current(timeline, names)
        return timeline.span(names, phase)

    def _phase_listener(self, name: str, begin: bool) -> None:
        """Called by the collective algorithms (through `phases`) to nest their stages in the timeline."""
        phases.record(name, begin)

    def _fail_set(self, st: _SetState, message: str) -> None:
        with self._lock:
            pending = list(st.inflight.values())
            st.inflight.clear()
            st.incoming.clear()
        for req in pending:
            if not req.handle.done():
                req.handle.set_error(CollectiveError(f"{req.sig.op_type.value} {req.sig.name!r}: {message}"))


def _duplicate(name: str) -> ValueError:
    return ValueError(
        f"a collective named {name!r} is already in flight on this rank; wait for it (synchronize) or use a "
        "different name"
    )


def _first_duplicate(names: Sequence[str], inflight: Mapping[str, object]) -> str:
    """The first of `names` already in flight or repeated within `names` (the caller knows there is one)."""
    seen: set[str] = set()
    for name in names:
        if name in inflight or name in seen:
            return name
        seen.add(name)
    raise AssertionError("no duplicate name")  # pragma: no cover - only called when a duplicate exists


def plan_batches(responses: list[Response], limit: int) -> list[list[Response]]:
    """Group responses into batches run one after the other: compatible allreduces (same dtype, op, scale
    factors, device) fused up to `limit` bytes, looking ahead over allreduces only (never past another op, so
    e.g. a barrier keeps its place). Deterministic, so every rank forms the same batches."""
    return [list(map(responses.__getitem__, idx)) for idx in plan_indices(responses, limit)]


def plan_indices(responses: Sequence[Response], limit: int) -> list[list[int]]:
    """`plan_batches` as positions in `responses` (what the engine remembers between cycles)."""
    n = len(responses)
    if limit <= 0 or n == 1:
        return [[i] for i in range(n)]
    sigs = list(map(_SIG, responses))
    keys = list(map(_FUSION_KEY, sigs))
    if (  # the steady state, one group of like allreduces: decided with C-level passes over the lists
        keys.count(keys[0]) == n
        and list(map(_OP_TYPE, sigs)).count(_ALLREDUCE) == n
        and list(map(_ERROR, responses)).count(None) == n
        and _itemsize(sigs[0].dtype) * sum(map(math.prod, map(_SHAPE, sigs))) <= limit
    ):
        return [list(range(n))]
    # Per response, computed once: its fusion key (None when it never fuses) and size; a look-ahead stops at
    # the first response that is not an allreduce.
    allreduce = [s.op_type is _ALLREDUCE for s in sigs]
    fusable = [
        k if ar and r.error is None else None for r, k, ar in zip(responses, keys, allreduce, strict=True)
    ]
    sizes = [_nbytes(r.sig) if k is not None else 0 for r, k in zip(responses, fusable, strict=True)]
    batches: list[list[int]] = []
    used = [False] * n
    for i in range(n):
        if used[i]:
            continue
        used[i] = True
        batch = [i]
        key = fusable[i]
        if key is not None:
            total = sizes[i]
            for j in range(i + 1, n):
                if not allreduce[j]:
                    break
                if used[j] or fusable[j] != key or total + sizes[j] > limit:
                    continue
                used[j] = True
                batch.append(j)
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


def _check_settings_agree(comm: Any, settings: EngineSettings, chunk: int, shm_slot: int) -> None:
    """ConfigError on every rank when ranks were started with different values of a setting that decides
    what goes over the wire (a launcher that forwards only some variables, a per-rank wrapper script): a
    different fusion threshold plans different batches, a different cache capacity gives the same bit other
    names, a different algorithm or chunk runs different message patterns: a hang or a wrong result later.
    (HPCRING_CPU_DEVICE_PLANE is not here: the route is part of every signature, so validation names it.)"""
    from hpcring.collective.algorithms.hierarchical import DEFAULT_SEGMENT_BYTES

    mine = (
        ("HPCRING_FUSION_THRESHOLD", settings.fusion_threshold),
        ("HPCRING_CACHE_CAPACITY", settings.cache_capacity),
        ("HPCRING_ALLREDUCE_ALGORITHM", settings.allreduce_algorithm),
        ("HPCRING_DEVICE_CROSS", settings.device_cross),
        (CHUNK_ENV, chunk),
        (SEGMENT_ENV, segment_bytes(DEFAULT_SEGMENT_BYTES)),
        (SLOT_ENV, shm_slot),
    )
    every: list[tuple[tuple[str, Any], ...]] = comm.allgather(mine)
    for (var, _), column in zip(mine, zip(*every, strict=True), strict=True):
        values = [value for _, value in column]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise ConfigError(
                f"{var} differs between ranks ({per_rank}); every rank must use the same value (HOROVOD_* "
                "aliases included): set it in the environment the launcher gives every rank"
            )


# What joined ranks cannot stand in for, as in Horovod's controller ("<Op> is not supported with Join at this
# time"): every op but allreduce (neutral values) and barrier (a joined rank is already waiting), and the
# process-set changes, which need every rank's own call.
_NO_STAND_IN = frozenset(
    {
        OpType.ALLGATHER,
        OpType.BROADCAST,
        OpType.ALLTOALL,
        OpType.REDUCESCATTER,
        OpType.ADD_PROCESS_SET,
        OpType.REMOVE_PROCESS_SET,
        OpType.TUNE,
    }
)


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


# Hot-path getters: C-level callables for map() over a cycle's requests and responses.
_REQ_SIG = operator.attrgetter("sig")
_SIG_NAME = operator.attrgetter("sig.name")  # requests and responses both carry .sig
_REQ_SET = operator.attrgetter("process_set_id")
_TENSOR = operator.attrgetter("tensor")
_OUTPUT = operator.attrgetter("output")
_HANDLE = operator.attrgetter("handle")
_SIG, _LOCAL, _ERROR, _BIT = (
    operator.itemgetter(Response._fields.index(f)) for f in ("sig", "local", "error", "bit")
)
_C_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")
_NBYTES = operator.attrgetter("nbytes")
_ARRAY_SHAPE = operator.attrgetter("shape")
_NDIM = operator.attrgetter("ndim")
_ADDRESS = operator.attrgetter("address")
_READONLY = operator.attrgetter("readonly")
_DTYPE = operator.attrgetter("dtype")
_is_none = functools.partial(operator.is_, None)
# Enum members read once: attribute access on an Enum class runs Python code (~0.3 us each on 3.11).
_ALLREDUCE = OpType.ALLREDUCE
_JOIN = OpType.JOIN


def _adjacent_span(
    arrays: Sequence[NDArray], buffer: Callable[[NDArray], Any], writeable: bool = False
) -> tuple[int, NDArray] | None:
    """(start address, one flat array over all of them) when `arrays` (at least two) are C-contiguous, of one
    dtype and lie back to back in memory in list order (and are writeable, if asked); else None.

    `buffer` exposes an array's memory as an object with `address`, `nbytes` and `readonly`, raising
    BufferError for a non-contiguous one: `mpi4py.MPI.buffer`, a C-level constructor about 6x cheaper per
    array than numpy's `.ctypes.data`. List order matters: every rank presents the batch to the collective in
    the (agreed) order of its responses, whether from a span or packed. The first two arrays are checked
    before anything else, so independently allocated tensors (never adjacent: the allocator keeps a header
    between blocks) cost about a microsecond. The span covers exactly the bytes of the arrays, all alive for
    the duration of the operation, so reading and writing it is reading and writing them."""
    try:
        one, two = buffer(arrays[0]), buffer(arrays[1])
        if one.address + one.nbytes != two.address:
            return None
        bufs = list(map(buffer, arrays))
    except BufferError:  # not contiguous
        return None
    addrs = list(map(_ADDRESS, bufs))
    if list(map(operator.add, addrs[:-1], map(_NBYTES, bufs))) != addrs[1:]:
        return None
    first, n = arrays[0], len(arrays)
    if writeable and any(map(_READONLY, bufs)):
        return None
    if list(map(_DTYPE, arrays)).count(first.dtype) != n:
        return None
    if list(map(_NDIM, arrays)).count(1) != n and not all(map(_C_CONTIGUOUS, arrays)):
        return None  # contiguous in Fortran order only: memory order is not the flattening order
    count = (addrs[-1] + bufs[-1].nbytes - addrs[0]) // first.itemsize
    span = np.lib.stride_tricks.as_strided(first.reshape(-1), shape=(count,), strides=(first.itemsize,))
    return addrs[0], span


def _postscale(sig: Signature, op: ReduceOp, size: int) -> float:
    """The factor applied after the sum: AVERAGE folds 1/size into the postscale (one rounding)."""
    return sig.postscale / size if op is ReduceOp.AVERAGE else sig.postscale


def _unpack(buf: NDArray, counts: list[int], outputs: list[NDArray]) -> None:
    """Copy consecutive pieces of `buf` (`counts` elements each) into `outputs`, as C-level passes.

    `out[...] = piece` is the cheapest numpy copy call; pieces are reshaped only when an output is not 1-D."""
    ends = list(itertools.accumulate(counts))
    pieces: Iterable[NDArray] = map(buf.__getitem__, map(slice, [0, *ends[:-1]], ends))
    if list(map(_NDIM, outputs)).count(1) != len(outputs):
        pieces = map(np.ndarray.reshape, pieces, map(_ARRAY_SHAPE, outputs))
    _drain(map(np.ndarray.__setitem__, outputs, repeat(Ellipsis), pieces))
