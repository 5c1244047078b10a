"""The background engine: one thread per process that negotiates, fuses and runs named collectives.

Framework code calls `submit()` with a Request and gets a Handle back at once. Every `cycle_time_ms` the
engine thread runs one cycle per process set this rank belongs to (in increasing set id, so two sets can
never wait on each other), using only the set's own duplicated communicator and only from the thread running
the cycle (so a user's MPI calls on their own communicators never interleave with ours):

1. one allreduce (bitwise AND) of a few 64-bit words: flags ("I have new requests", "shut down", "stall
   abort") and, per response-cache bit, "I have this cached request pending" / "I do not have it"; requests
   every rank has pending with an identical cached signature are ready with no further exchange;
2. only when some rank has new (uncached) requests: one allgather of their small signatures into a table
   identical on every rank; a name is ready when every rank (or every rank that has not joined) submitted
   it, and then it is validated: a disagreement becomes an error response, raised on every rank;
3. ready responses execute in the same order on every rank; consecutive compatible allreduces are packed into
   fusion batches up to `fusion_threshold` bytes and moved by the host plane (numpy, MPI) or the device plane
   (torch tensors on a device).

The parts, each built with the shared `EngineState` and nothing else of the engine's: `Negotiator` (steps 1
and 2, with the `StallInspector`), `Executor` (step 3, with `HostPlane` and `DevicePlane`), `CallerCycles`
(a waiting thread running the cycle itself). This class owns the thread, the lifecycle, the public API and
the process sets.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcring.collective import kernels
from hpcring.config import ALGORITHMS, EngineSettings
from hpcring.contracts.elastic import HOST as ELASTIC_HOST
from hpcring.engine import unmatched
from hpcring.engine.bitvector import _NO_ABORT, _NO_SHUTDOWN, _NO_TIMEOUT
from hpcring.engine.caller_cycles import CallerCycles, wake_deferred
from hpcring.engine.engine_state import EngineState
from hpcring.engine.execution import Executor
from hpcring.engine.host_plane import HostPlane
from hpcring.engine.lone_cycle import build as build_lone_cycle
from hpcring.engine.negotiation import Negotiator
from hpcring.engine.request import Handle, OpType, Request, Signature
from hpcring.engine.responses import _REQ_SET, _SIG_NAME, Response
from hpcring.engine.roll_call import RollCall
from hpcring.engine.set_state import SetState
from hpcring.engine.settings_check import check_settings_agree
from hpcring.engine.timeline import Timeline
from hpcring.engine.watchdog import EXCHANGE, NEGOTIATION, Watchdog
from hpcring.errors import CollectiveError, CollectiveTimeoutError, ConfigError, choices

log = logging.getLogger("hpcring.engine")

_IDLE_WAIT_S = 0.02


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
        self.world_rank: int = world.rank
        self.world_size: int = world.size
        self._state = state = EngineState(settings)
        # Read on every tensor's submit; `tune` never changes it (a plain attribute, not a property hop).
        self.cpu_tensors_on_host = settings.cpu_device_plane == "off"
        # Wake-up tokens for the engine thread: a C queue, so a submit wakes it with one hand-off (a Condition
        # would wake it while the submitter still holds the lock, costing a second switch).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._set_ranks: dict[int, tuple[int, ...]] = {}  # every registered set, member or not
        self._next_set_id = 1
        self._stop_reason: str | None = None
        self._stopped = False  # the engine thread has ended (set under the lock; read on every submit)
        self._timed_out = False  # a request waited past the collective timeout for ranks that never sent it
        self._shutdown_called = False
        self._cycle_no = 0
        self._tunes = 0  # Engine.tune calls on this rank: numbers their names
        chunk = kernels.chunk_bytes(kernels.DEFAULT_CHUNK_BYTES)  # ring pipelining chunk, read once
        shm_slot = kernels.slot_limit()  # largest fused batch through shared memory, read once
        check_settings_agree(world.comm, settings, kernels.wire_settings(chunk, shm_slot))
        # Every rank's host, gathered now: a collective timeout must name hosts without talking to anyone.
        # Under the elastic driver, the name it assigned (and blacklists by).
        hosts = world.comm.allgather(os.environ.get(ELASTIC_HOST) or socket.gethostname())
        self._watchdog = Watchdog(state, world.rank, hosts, RollCall(self._mpi, world.comm))
        self._negotiator = Negotiator(state, self._mpi)
        self._executor = Executor(state, HostPlane(state, chunk, shm_slot, self._mpi.buffer), self)
        self._caller = CallerCycles(state, self._wake, self._cycle)
        # The waiting thread's entry points, bound once: they run on every synchronous op. In the compiled
        # core the plain cycles of a lone small host allreduce run in C (lone_cycle.py).
        self.deferred_wake = self._caller.deferred_wake
        lone = build_lone_cycle(self, state, self._caller, self._watchdog, self._wake, self._mpi)
        self.run_inline = self._caller.run_inline if lone is None else lone.run_inline
        # The engine thread's cycle: the same plain cycle in C for a lone async request.
        self._thread_cycle: Callable[[], bool] = self._cycle if lone is None else lone.cycle
        self._configure_logging()
        root = world.subset(range(world.size))  # the engine's own communicators, never the caller's
        self._register(0, tuple(range(world.size)), root)
        for ranks in static_sets:
            self.create_set(tuple(sorted(int(r) for r in ranks)))
        if settings.timeline:
            self.start_timeline(settings.timeline, settings.timeline_mark_cycles)
        self._thread = threading.Thread(target=self._run, name="hpcring-engine", daemon=True)
        self._thread.start()
        self._watchdog.start()
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ what callers read

    @property
    def settings(self) -> EngineSettings:
        """The settings in force (an agreed `tune` changes them)."""
        return self._state.settings

    @property
    def stats(self) -> dict[str, int]:
        """Counters for tests and benchmarks."""
        return self._state.stats

    @property
    def device_plane(self) -> Any:
        """The device data plane, once a device batch has run (None before)."""
        return self._executor.device

    @property
    def running(self) -> bool:
        return not self._stopped

    # ------------------------------------------------------------------ public API (caller threads)

    def submit(self, req: Request) -> Handle:
        """Queue a request; ValueError for a name already in flight in its process set on this rank."""
        name = req.sig.name
        state = self._state
        with state.lock:
            if state.closed or self._stopped:
                raise self._shut_down()
            st = state.sets.get(req.process_set_id) or self._member_state(req.process_set_id)
            if name in st.inflight:
                raise _duplicate(name)
            st.inflight[name] = req
            st.incoming.append(req)
        if not wake_deferred():
            self._wake.put(None)
        return req.handle

    def submit_many(self, reqs: Sequence[Request]) -> None:
        """Queue requests atomically: they reach negotiation in the same cycle, so a group (e.g. a grouped
        allreduce) becomes ready, and is fused, together. Nothing is queued if any request is refused."""
        names = list(map(_SIG_NAME, reqs))
        set_ids = list(map(_REQ_SET, reqs))
        state = self._state
        with state.lock:
            if state.closed or self._stopped:
                raise self._shut_down()
            if names and set_ids.count(set_ids[0]) == len(set_ids):  # one set: C-level checks and inserts
                st = state.sets.get(set_ids[0]) or self._member_state(set_ids[0])
                inflight = st.inflight
                if len(set(names)) != len(names) or not inflight.keys().isdisjoint(names):
                    raise _duplicate(_first_duplicate(names, inflight))
                inflight.update(zip(names, reqs, strict=True))
                st.incoming.extend(reqs)
            else:
                self._submit_mixed(reqs, names, set_ids)
        if not wake_deferred():
            self._wake.put(None)

    def wake(self) -> None:
        """Wake the engine thread (after `deferred_wake`, when the caller does not run the cycle itself)."""
        self._wake.put(None)

    def _shut_down(self) -> CollectiveError:
        return CollectiveError(f"hpcring engine is shut down ({self._stop_reason or 'shutdown() called'})")

    def _submit_mixed(self, reqs: Sequence[Request], names: list[str], set_ids: list[int]) -> None:
        """submit_many for requests of several process sets (engine lock held)."""
        sets = self._state.sets
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

    def _member_state(self, set_id: int) -> SetState:
        st = self._state.sets.get(set_id)
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
        with self._state.lock:
            if set_id not in self._set_ranks:
                raise ValueError(f"process set {set_id} is not registered (removed, or never added)")
            return self._set_ranks[set_id]

    def find_set(self, ranks: Sequence[int]) -> int | None:
        """Id of a registered set with exactly these ranks."""
        wanted = tuple(sorted(ranks))
        with self._state.lock:
            for sid, rs in self._set_ranks.items():
                if rs == wanted:
                    return sid
        return None

    def tune(self, fusion_threshold: int | None = None, cycle_time_ms: float | None = None) -> Handle:
        """Change the fusion threshold (bytes) and cycle time (ms) of the running engine: the hook an
        autotuner drives. Collective over the global set, negotiated like any op: every rank calls it (the
        same number of times, in its op sequence), and the values of the global set's rank 0 are applied on
        every rank when the request executes, so batches planned after it use the new threshold on every rank
        (the fusion layout must agree). Other ranks may pass None; None on rank 0 keeps that setting. The
        handle's result is the (fusion_threshold, cycle_time_ms) now in force. ValueError for a negative
        value."""
        for what, value in (("fusion_threshold", fusion_threshold), ("cycle_time_ms", cycle_time_ms)):
            if value is not None and (isinstance(value, bool) or not value >= 0):
                raise ValueError(f"Engine.tune: {what} must be a number >= 0 or None, got {value!r}")
        with self._state.lock:
            self._tunes += 1
            name = f"engine.tune.{self._tunes}"
        extra = (
            -1 if fusion_threshold is None else int(fusion_threshold),
            -1 if cycle_time_ms is None else round(cycle_time_ms * 1000),
        )
        return self.submit(Request(Signature(name, OpType.TUNE, extra=extra), 0))

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
        with self._state.lock:
            old, self._state.timeline = self._state.timeline, timeline
        if old is not None:
            old.close()

    def stop_timeline(self) -> None:
        """Close the trace file (the JSON array is terminated so the file is valid JSON)."""
        with self._state.lock:
            old, self._state.timeline = self._state.timeline, None
        if old is not None:
            old.close()

    def shutdown(self, reason: str = "shutdown() called on this rank", timeout: float = 60.0) -> None:
        """Stop the engine on every rank (the request propagates in the next cycle), fail pending requests."""
        state = self._state
        with state.lock:
            if self._shutdown_called:
                return
            self._shutdown_called = True
            state.closed = True
            if self._stop_reason is None:
                self._stop_reason = reason
        self._wake.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("engine thread did not stop within %.0f s (a peer rank may have died)", timeout)
            return
        self.stop_timeline()
        self._watchdog.close()
        self._executor.close()
        for st in state.sets.values():
            st.topology.free()
        state.sets.clear()

    # ------------------------------------------------------------------ control operations (agreed)

    def create_set(self, ranks: tuple[int, ...]) -> int:
        """Register a set on every rank (members create its communicators); returns its id."""
        if not ranks or any(not 0 <= r < self.world_size for r in ranks) or len(set(ranks)) != len(ranks):
            raise ConfigError(
                f"process set ranks must be distinct ranks from 0 to {self.world_size - 1}, got {list(ranks)}"
            )
        set_id = self._next_set_id
        self._next_set_id += 1
        topo = self._state.sets[0].topology.subset(ranks) if self.world_rank in ranks else None
        with self._state.lock:
            self._register(set_id, ranks, topo)
        return set_id

    def remove_set(self, set_id: int) -> None:
        """Unregister a set on every rank, failing what is pending in it."""
        with self._state.lock:
            st = self._state.sets.pop(set_id, None)
            self._set_ranks.pop(set_id, None)
        if st is not None:
            self._fail_set(st, f"process set {set_id} was removed while this request was pending")
            self._executor.release(set_id)
            st.topology.free()

    def apply_tuning(self, extra: tuple[int, ...]) -> tuple[int, float]:
        """An agreed TUNE response: the new settings, and forget remembered fusion plans (they were made
        with the old threshold)."""
        state = self._state
        threshold, cycle_us = extra
        changes: dict[str, Any] = {}
        if threshold >= 0:
            changes["fusion_threshold"] = threshold
        if cycle_us >= 0:
            changes["cycle_time_ms"] = cycle_us / 1000
        state.settings = dataclasses.replace(state.settings, **changes)
        for st in state.sets.values():
            st.plan_memo = None
        state.stats["tunes"] += 1
        in_force = state.settings.fusion_threshold, state.settings.cycle_time_ms
        timeline = state.timeline
        if timeline is not None:  # the autotuner's switches are visible in the trace, on their own row
            args = {"fusion_threshold": in_force[0], "cycle_time_ms": in_force[1]}
            timeline.instant("engine.tune", "TUNE", args=args)
        return in_force

    def _register(self, set_id: int, ranks: tuple[int, ...], topology: Any) -> None:
        self._set_ranks[set_id] = ranks
        if topology is not None:
            self._state.sets[set_id] = SetState(set_id, ranks, topology, self._state.settings)

    # ------------------------------------------------------------------ the thread

    def _configure_logging(self) -> None:
        root = logging.getLogger("hpcring")
        level_name = self._state.settings.log_level
        level = {"trace": logging.DEBUG, "fatal": logging.CRITICAL}.get(level_name)
        root.setLevel(level or getattr(logging, level_name.upper()))
        if not root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter(f"[hpcring rank {self.world_rank}] %(levelname)s: %(message)s")
            )
            root.addHandler(handler)

    def _run(self) -> None:
        caller = self._caller
        try:
            woken = False
            while True:
                start = time.monotonic()
                with caller.lock:  # a caller may be running the cycle itself
                    if caller.take_end():
                        break
                    if not (woken and caller.nothing_to_do()) and self._thread_cycle():
                        break
                woken = self._sleep(start, self._state.settings.cycle_time_ms / 1000.0)
        except BaseException as exc:  # the thread must never die silently: callers would wait forever
            log.exception("hpcring engine thread failed")
            self._stop_reason = f"engine thread failed: {exc!r}"
        finally:
            self._watchdog.stop()
            with self._state.lock:
                self._stopped = True
                self._state.closed = True  # the one flag the core's submit reads
                sets = list(self._state.sets.values())
            fired = self._watchdog.fired
            if fired is not None:  # the collective timeout's words, as its own thread would raise them
                self._watchdog.fail_pending(fired)
            for st in sets:
                self._fail_set(st, f"hpcring shut down: {self._stop_reason or 'a rank shut down'}")

    def _sleep(self, start: float, period: float) -> bool:
        """Wait for the next cycle; True when a submit woke an idle thread (the submitter may have run the
        cycle itself meanwhile), False when the cycle is due anyway.

        With requests in flight the next cycle starts `period` after this one (the fusion window: requests
        submitted meanwhile are negotiated together). With nothing in flight on this rank the thread waits for
        a submit, which wakes it at once (a lone synchronous op does not pay the window), or _IDLE_WAIT_S at
        most (shutdown and stall checks). It does not run idle cycles on the `period` clock: nothing a peer
        waits for can complete before this rank submits it, and an idle cycle that starts just before a
        submission pairs (negotiation is collective, cycle by cycle) with a peer's cycle that carries the
        request, which then waits a whole period for the next one.
        """
        wake = self._wake
        while not wake.empty():  # tokens of submissions this cycle already took in
            wake.get_nowait()
        state = self._state
        with state.lock:
            if state.closed:
                return False
            if any(st.incoming for st in state.sets.values()):
                return False
            locally_idle = not state.work_pending()
        if locally_idle:
            try:  # a submit after the check above left a token: no wait
                wake.get(timeout=max(period, _IDLE_WAIT_S))
            except queue.Empty:
                return False
            return True
        delay = start + period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return False

    def _cycle(self) -> bool:
        """One negotiation cycle over every set this rank is in; True when the engine must stop."""
        try:
            return self._cycle_sets()
        finally:
            self._watchdog.current = None  # waiting on no peer until the next cycle

    def _cycle_sets(self) -> bool:
        state = self._state
        self._cycle_no += 1
        state.stats["cycles"] += 1
        timeline = state.timeline
        watchdog = self._watchdog
        for set_id in sorted(state.sets):
            st = state.sets.get(set_id)
            if st is None:  # removed earlier in this cycle
                continue
            watchdog.current = (NEGOTIATION, st, None)
            responses, flags = self._negotiator.negotiate(st, timeline)
            if self._after_negotiation(st, responses, flags, timeline):
                return True
        return False

    def _after_negotiation(
        self, st: SetState, responses: list[Response], flags: int, timeline: Timeline | None
    ) -> bool:
        """The rest of one set's cycle once negotiation agreed: stop, abort, time out or execute; True when
        the engine must stop."""
        if st.id == 0 and not flags & _NO_SHUTDOWN:
            if self._stop_reason is None:
                self._stop_reason = "another rank shut down hpcring (it called shutdown() or exited)"
            return True
        if not flags & _NO_ABORT:
            self._abort_stalled(st)
        if not flags & _NO_TIMEOUT:
            self._unmatched_timeout(st)
        if responses:
            self._watchdog.current = (EXCHANGE, st, responses)
            if timeline is not None:
                timeline.cycle(self._cycle_no)
            self._executor.execute(st, responses, timeline)
        return False

    def _conclude_lone(self, st: SetState, now: float, flags: int, hit: int, absent: int) -> bool:
        """The compiled lone cycle's way back (engine/lone_cycle.py): it ran intake and the agreement, and
        the outcome is not the plain one it finishes itself; the Python cycle takes over from there."""
        try:
            responses, flags = self._negotiator.conclude(st, None, now, flags, hit, absent)
            return self._after_negotiation(st, responses, flags, None)
        finally:
            self._watchdog.current = None

    def _abort_stalled(self, st: SetState) -> None:
        with self._state.lock:
            if self._stop_reason is None:
                self._stop_reason = (
                    f"a collective stalled for more than {self._state.settings.stall_shutdown_time_s:.0f} s "
                    f"in process set {st.id} (HPCRING_STALL_SHUTDOWN_TIME_SECONDS); rank {st.ranks[0]} "
                    "logged the stalled tensors"
                )
            self._state.closed = True

    def _unmatched_timeout(self, st: SetState) -> None:
        """A request of this set waited past the collective timeout for ranks that never submitted it (every
        rank learns it in the same cycle): the watchdog says which ranks submitted what and ends this rank."""
        if self._timed_out:
            return
        rows = st.unmatched or []
        timeout = self._state.settings.collective_timeout_s
        report = unmatched.describe(rows, st, time.monotonic(), timeout, self._watchdog.host)
        with self._state.lock:
            self._timed_out = True
            if self._stop_reason is None:
                self._stop_reason = report
        submitted = any(self.world_rank in row.submitted for row in rows)
        self._watchdog.expire_unmatched(report, submitted)

    def _fail_set(self, st: SetState, message: str) -> None:
        with self._state.lock:
            pending = list(st.inflight.values())
            st.inflight.clear()
            st.incoming.clear()
        error = CollectiveTimeoutError if self._timed_out else CollectiveError
        for req in pending:
            if not req.handle.done():
                req.handle.set_error(error(f"{req.sig.op_type.value} {req.sig.name!r}: {message}"))


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


def _shutdown_at_exit(ref: weakref.ref[Engine]) -> None:
    """Stop a running engine when the interpreter exits, so peers see the shutdown instead of hanging."""
    engine = ref()
    if engine is not None:
        engine.shutdown("this rank's process is exiting", timeout=10.0)
