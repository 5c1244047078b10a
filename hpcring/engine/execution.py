"""Execution: running a cycle's agreed responses in the same order on every rank (step 3 of a cycle).

The executor plans the fusion batches, hands each to the plane that moves its data (host or device) or
applies a control operation (process sets, tuning), records executed batches in the response cache, and
completes the callers' handles with one lock round per batch."""

from __future__ import annotations

import math
import time
from itertools import repeat
from typing import Any, Protocol

from hpcring.engine.device_plane import DevicePlane
from hpcring.engine.device_routes import ROUTES as DEVICE_ROUTES
from hpcring.engine.engine_state import EngineState
from hpcring.engine.host_plane import HostPlane
from hpcring.engine.request import CACHEABLE, OpType, complete
from hpcring.engine.responses import (
    _ALLREDUCE,
    _BIT,
    _HANDLE,
    _LOCAL,
    _SHAPE,
    _SIG,
    _SIG_NAME,
    Response,
    _Plan,
    plan_indices,
)
from hpcring.engine.set_state import SetState
from hpcring.engine.timeline import Timeline
from hpcring.errors import CollectiveError


class ControlOps(Protocol):
    """The agreed operations that change the engine itself, carried out by `Engine`."""

    def create_set(self, ranks: tuple[int, ...]) -> int: ...

    def remove_set(self, set_id: int) -> None: ...

    def apply_tuning(self, extra: tuple[int, ...]) -> tuple[int, float]: ...


class Executor:
    """Step 3 of a cycle; runs on whichever thread runs the cycle."""

    def __init__(self, state: EngineState, host: HostPlane, control: ControlOps) -> None:
        self._state = state
        self._host = host
        self._control = control
        self.device: DevicePlane | None = None  # batches of device tensors, built on the first one

    def execute(self, st: SetState, responses: list[Response], timeline: Timeline | None) -> None:
        """Run one set's ready responses, batch by batch, in the agreed order."""
        stats = self._state.stats
        if timeline is not None:
            _open_spans(timeline, st, responses)
        plan, counts = self._plan(st, responses)
        for idx, batch_counts in zip(plan, counts, strict=True):
            batch = responses if len(idx) == len(responses) else list(map(responses.__getitem__, idx))
            stats["batches"] += 1
            if len(batch) > 1:
                stats["fused"] += len(batch)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, "QUEUE", when=now)
            self._run_batch(st, batch, timeline, batch_counts)
            if timeline is not None:
                now = time.monotonic()
                for r in batch:
                    timeline.end(r.sig.name, r.sig.op_type.name, when=now)

    def release(self, set_id: int) -> None:
        """A process set was removed: its device resources go too."""
        if self.device is not None:
            self.device.release(set_id)

    def close(self) -> None:
        """Engine shutdown: every device resource."""
        if self.device is not None:
            self.device.close()

    def _plan(self, st: SetState, responses: list[Response]) -> tuple[_Plan, list[list[int] | None]]:
        """`plan_indices` and, per batch, the element count of each tensor (None: not known in advance).

        Remembered for a repeated set of cached responses: a training step's gradients come back ready
        together step after step, and the plan depends only on their signatures, which the ready bits and the
        cache's version identify."""
        threshold = self._state.settings.fusion_threshold
        key = st.ready_key
        if key is None or len(responses) != key[2]:  # table responses too: plan afresh
            plan = plan_indices(responses, threshold)
            return plan, [None] * len(plan)
        memo = st.plan_memo
        if memo is not None and memo[0] == key:
            return memo[1], memo[2]
        plan = plan_indices(responses, threshold)
        sigs = list(map(_SIG, responses))
        counts: list[list[int] | None] = [
            list(map(math.prod, map(_SHAPE, map(sigs.__getitem__, idx)))) for idx in plan
        ]
        st.plan_memo = (key, plan, counts)
        return plan, counts

    def _run_batch(
        self, st: SetState, batch: list[Response], timeline: Timeline | None, counts: list[int] | None
    ) -> None:
        first = batch[0]
        err: CollectiveError | None = None
        results: list[Any] = [None] * len(batch)
        try:
            if first.error is not None:
                raise CollectiveError(first.error)
            op = first.sig.op_type
            if first.sig.device in DEVICE_ROUTES:  # torch tensors on a device: the device plane, never numpy
                if self.device is None:
                    self.device = DevicePlane(self._state, self._host)
                results = self.device.run(st.id, st.topology, batch, timeline)
            elif op is _ALLREDUCE:
                results = self._host.allreduce(st, batch, timeline, counts)
            elif op in CACHEABLE:
                results = [self._host.single(st, first, timeline)]
            else:
                results = [self._control_op(first)]
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
            _remember(st, batch)
        self._finish_many(st, batch, results, err)

    def _control_op(self, r: Response) -> Any:
        """Join, barrier, process-set changes and tuning: agreed, executed at the same point everywhere."""
        sig = r.sig
        op = sig.op_type
        if op is OpType.JOIN:
            return r.result
        if op is OpType.BARRIER:
            return None  # readiness already proves every rank arrived
        if op is OpType.ADD_PROCESS_SET:
            return self._control.create_set(tuple(sig.extra))
        if op is OpType.REMOVE_PROCESS_SET:
            self._control.remove_set(sig.extra[0])
            return None
        if op is OpType.TUNE:
            return self._control.apply_tuning(sig.extra)
        raise CollectiveError(f"unknown operation {op!r}")

    def _finish_many(
        self, st: SetState, batch: list[Response], results: list[Any], error: BaseException | None = None
    ) -> None:
        """Hand results (or the error) to this rank's requests: one lock round, C-level passes."""
        lock = self._state.lock
        if len(batch) == 1:  # the latency path: no lists
            req = batch[0].local
            if req is not None:
                with lock:
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
        with lock:
            popped = list(map(inflight.pop, names, repeat(None)))
            if popped != reqs:  # an entry that is not this request (defensive): put it back
                for name, was, req in zip(names, popped, reqs, strict=True):
                    if was is not None and was is not req:
                        inflight[name] = was
        complete(list(map(_HANDLE, reqs)), results, error)


def _open_spans(timeline: Timeline, st: SetState, responses: list[Response]) -> None:
    """Timeline: negotiation ends and the operation (queued first) begins when it was found ready."""
    for r in responses:
        name = r.sig.name
        if name in st.negotiating:
            st.negotiating.discard(name)
            timeline.end(name, f"NEGOTIATE_{r.sig.op_type.name}", when=r.ready_at)
        timeline.begin(name, r.sig.op_type.name, when=r.ready_at)
        timeline.begin(name, "QUEUE", when=r.ready_at)


def _remember(st: SetState, batch: list[Response]) -> None:
    """Record an executed batch in the response cache, in execution order (identical on every rank).

    A batch is either one response or allreduces only (`plan_batches`), so the first op decides. Responses
    that came from the cache are refreshed with one C-level pass; the rest are put one by one, and a request
    waiting on a bit that a put evicted renegotiates through the table."""
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
