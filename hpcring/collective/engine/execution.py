"""Execution: running a cycle's agreed responses in the same order on every rank (step 3 of `engine.py`'s
docstring). The hot path of a training step: fused allreduces reduced where the tensors lie (adjacent
views), through the node's shared memory, or packed into the persistent fusion buffer; results handed to
the callers with one lock round per batch."""

from __future__ import annotations

import functools
import math
import operator
import time
from itertools import repeat
from typing import Any

import numpy as np

from hpcring.collective import api, dtypes
from hpcring.collective.algorithms.shm import shm_round
from hpcring.collective.engine import phases
from hpcring.collective.engine.buffers import _adjacent_span, _is_none, _postscale, _unpack
from hpcring.collective.engine.device import ROUTES as DEVICE_ROUTES
from hpcring.collective.engine.device import DevicePlane
from hpcring.collective.engine.joined import _neutral
from hpcring.collective.engine.request import CACHEABLE, OpType, Request, Signature, complete
from hpcring.collective.engine.responses import (
    _ALLREDUCE,
    _BIT,
    _HANDLE,
    _LOCAL,
    _OUTPUT,
    _SHAPE,
    _SIG,
    _SIG_NAME,
    _TENSOR,
    Response,
    _Plan,
    numpy_dtype,
    plan_indices,
)
from hpcring.collective.engine.state import EngineCore, _SetState
from hpcring.collective.engine.timeline import NULL_SPAN, Timeline
from hpcring.collective.ops import ReduceOp
from hpcring.errors import CollectiveError

NDArray = np.ndarray[Any, Any]


_REDUCE_OPS = {op.value: op for op in ReduceOp}  # by agreed name; Enum's by-value lookup is slow

# Out of place from this size on: copy the input into the output and reduce there in place. A new output
# is memory nobody has touched yet, and the algorithms' transfers into it (MPI receives, the ring's
# reductions) page-faulted it in at a fraction of the speed of one copy: 64 MiB at 2 ranks took 198 ms out of
# place against 42 ms in place (benchmarks/bench_torch_ops.py). Not for shared memory, which writes the
# output with plain copies only: staged, 64 MiB took 31-32 ms there, straight 27-28 ms (2 ranks, 2026-11-27).
_STAGE_IN_PLACE_BYTES = 1 << 20
SHM_FUSED_MIN_BYTES = 64 << 10  # smaller fused batches: MPI's latency beats two node barriers
# A contiguous request (a gradient bucket, a tensor) under `auto` goes through shared memory from this many
# ranks on one node (the collective library's own rule waits for 4). The engine reduces beside a training
# thread: the ring's blocking MPI waits busy-poll and take the CPU that thread needs, shm's barriers yield it.
# 200-tensor MLP at 2 ranks (one 6.3 MiB bucket), paired launches: 0.78x DDP's step against 0.83x with the
# ring; the 4-layer MLP, ResNet-style and transformer models unchanged (docs/bench-ddp.md).
ENGINE_SHM_MIN_RANKS = 2
# ... in rounds of at most this many bytes: the segment ((ranks + 1) slots, mapped by every rank on the node)
# then stays small. With whole 16 MiB buckets (the 4-layer MLP) rank 0's peak RSS grew by 16-19 MiB, 7 %
# above DDP's. Fused batches of separate tensors still take up to one whole slot (`_shared_memory_batch`).
ENGINE_SHM_ROUND_BYTES = 4 << 20


class Execution(EngineCore):
    """Mixed into `Engine`; runs on the engine thread only."""

    # Provided by `Engine` (process sets and tuning change the engine itself).
    def _create_set(self, ranks: tuple[int, ...]) -> int:
        raise NotImplementedError

    def _remove_set(self, set_id: int) -> None:
        raise NotImplementedError

    def _apply_tuning(self, extra: tuple[int, ...]) -> tuple[int, float]:
        raise NotImplementedError

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
        algorithm = api.pick_allreduce(
            st.topology, flat_src, op, self.settings.allreduce_algorithm, ENGINE_SHM_MIN_RANKS
        )
        staged = flat_dst is not flat_src and flat_dst.nbytes >= _STAGE_IN_PLACE_BYTES and algorithm != "shm"
        if sig.prescale != 1.0 or staged:
            if flat_dst is not flat_src:
                flat_dst[...] = flat_src
            if sig.prescale != 1.0:
                dtypes.scale(flat_dst, sig.prescale)
            flat_src = flat_dst
        post = _postscale(sig, op, st.size)
        used = api.run_allreduce(
            st.topology,
            flat_src,
            flat_dst,
            op,
            algorithm,
            self._chunk,
            shm_min_ranks=ENGINE_SHM_MIN_RANKS,
            shm_round_bytes=ENGINE_SHM_ROUND_BYTES,
            finish=None if post == 1.0 else functools.partial(dtypes.scale, factor=post),
        )
        self.stats["shm"] += used == "shm"

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
            return self._allreduce_alone(st, tensors, outputs, counts, dtype, sig)
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
    def _allreduce_alone(
        st: _SetState,
        tensors: list[NDArray],
        outputs: list[NDArray],
        counts: list[int],
        dtype: np.dtype[Any],
        sig: Signature,
    ) -> list[Any]:
        """A fused batch in a set of one rank: the reduction is the input itself. In place, nothing moves; one
        output elsewhere gets one copy (numpy buffers an overlap with its own input); several go through the
        fusion buffer, all read before any is written, as on more ranks: an output may lie over another
        request's input (copied one by one, an earlier copy would overwrite a later input)."""
        moved = [i for i, (t, out) in enumerate(zip(tensors, outputs, strict=True)) if out is not t]
        if len(moved) == 1:
            i = moved[0]
            outputs[i][...] = tensors[i].reshape(outputs[i].shape)
        elif moved:
            part = [counts[i] for i in moved]
            buf = st.fusion_view(dtype, sum(part))
            np.concatenate([tensors[i] for i in moved], axis=None, out=buf)
            _unpack(buf, part, [outputs[i] for i in moved])
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
