"""The host data plane: agreed batches of numpy views reduced over MPI (and the node's shared memory).

The hot path of a CPU training step: fused allreduces reduced where the tensors lie (adjacent views), through
the node's shared memory, or packed into the persistent fusion buffer. Everything goes through
`hpcring.collective.kernels`, without the public API's checks: the arguments were checked at submit and
agreed in negotiation."""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import numpy as np

from hpcring.collective import dtypes, kernels
from hpcring.collective.ops import BY_VALUE as _REDUCE_OPS
from hpcring.collective.stages import unobserved
from hpcring.collective.topology import Topology
from hpcring.engine.engine_state import EngineState
from hpcring.engine.host_adasum import ADASUM, adasum_batch
from hpcring.engine.host_buffers import _adjacent_span, _is_none, _postscale, _unpack
from hpcring.engine.joined import _neutral
from hpcring.engine.request import OpType, Request, Signature
from hpcring.engine.responses import _LOCAL, _OUTPUT, _SHAPE, _SIG, _SIG_NAME, _TENSOR, Response, numpy_dtype
from hpcring.engine.set_state import SetState
from hpcring.engine.timeline import NULL_SPAN, Timeline, span, stage_hook
from hpcring.errors import CollectiveError

NDArray = np.ndarray[Any, Any]


# Out of place from this size on: copy the input into the output and reduce there in place. A fresh output is
# untouched memory, and the algorithms' transfers into it fault its pages in far slower than one copy does.
# Not for shared memory, which writes the output with plain copies only.
_STAGE_IN_PLACE_BYTES = 1 << 20
SHM_FUSED_MIN_BYTES = 64 << 10  # smaller fused batches: MPI's latency beats two node barriers
# A contiguous request under `auto` goes through shared memory from this many ranks on one node (the
# collective library's own rule waits for more): the engine reduces beside a training thread, and the
# ring's blocking MPI waits busy-poll the CPU that thread needs, while shared memory's barriers yield it.
ENGINE_SHM_MIN_RANKS = 2
# ... in rounds of at most this many bytes, so the segment ((ranks + 1) slots on every rank of the node)
# stays small next to the model. Fused batches of separate tensors still take up to one whole slot.
ENGINE_SHM_ROUND_BYTES = 4 << 20


class HostPlane:
    """Runs host batches (numpy views) for the executor; engine thread, or a caller running the cycle."""

    def __init__(self, state: EngineState, chunk: int, shm_slot: int, buffer: Any) -> None:
        """`chunk`: the ring's pipelining chunk; `shm_slot`: the largest fused batch through shared memory;
        `buffer`: an array's memory as address, size and read-only flag (mpi4py's `MPI.buffer`)."""
        self._state = state
        self._chunk = chunk
        self._shm_slot = shm_slot
        self._buffer = buffer

    # ------------------------------------------------------------------ allreduce

    def reduce(
        self,
        topo: Topology,
        src: NDArray,
        dst: NDArray,
        sig: Signature,
        timeline: Timeline | None,
        names: list[str],
    ) -> str:
        """dst = allreduce(src) with the agreed op and scale factors (dst may be src); returns the algorithm
        that ran."""
        op = _REDUCE_OPS[sig.reduce_op]
        flat_src = src.reshape(-1)
        flat_dst = flat_src if dst is src else dst.reshape(-1)
        settings = self._state.settings
        algorithm = kernels.pick_allreduce(
            topo, flat_src, op, settings.allreduce_algorithm, ENGINE_SHM_MIN_RANKS
        )
        staged = flat_dst is not flat_src and flat_dst.nbytes >= _STAGE_IN_PLACE_BYTES and algorithm != "shm"
        if sig.prescale != 1.0 or staged:
            if flat_dst is not flat_src:
                flat_dst[...] = flat_src
            if sig.prescale != 1.0:
                dtypes.scale(flat_dst, sig.prescale)
            flat_src = flat_dst
        post = _postscale(sig, op, topo.size)
        used = kernels.allreduce(
            topo,
            flat_src,
            flat_dst,
            op,
            algorithm,
            self._chunk,
            shm_min_ranks=ENGINE_SHM_MIN_RANKS,
            shm_round_bytes=ENGINE_SHM_ROUND_BYTES,
            finish=None if post == 1.0 else functools.partial(dtypes.scale, factor=post),
            stages=unobserved if timeline is None else stage_hook(timeline, names),
        )
        self._state.stats["shm"] += used == "shm"
        return used

    def allreduce(
        self,
        st: SetState,
        batch: list[Response],
        timeline: Timeline | None,
        counts: list[int] | None = None,
    ) -> list[Any]:
        """One (fused) allreduce; returns each request's output (None for a joined rank's entries)."""
        stats = self._state.stats
        sig = batch[0].sig
        if sig.reduce_op == ADASUM:  # not element-wise: its own path (host_adasum.py)
            return adasum_batch(st, batch, timeline)
        dtype = numpy_dtype(sig.dtype)
        names = list(map(_SIG_NAME, batch)) if timeline is not None else []
        reqs: list[Any] = list(map(_LOCAL, batch))
        if len(batch) == 1 and reqs[0] is not None and reqs[0].tensor is not None:  # the latency path
            req = reqs[0]
            dst = req.output if req.output is not None else req.tensor
            with NULL_SPAN if timeline is None else timeline.span(names, "COLLECTIVE"):
                self.reduce(st.topology, req.tensor, dst, sig, timeline, names)
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
            stats["no_pack"] += 1
            stats["no_unpack"] += 1
            with span(timeline, names, "COLLECTIVE"):
                self.reduce(st.topology, src, dst, sig, timeline, names)
            return outputs
        if st.size == 1 and sig.prescale == 1.0:
            return self._allreduce_alone(st, tensors, outputs, counts, dtype, sig)
        if self._shared_memory_batch(st, tensors, outputs, counts, dtype, sig, timeline, names):
            return outputs  # (an adjacent side is copied into or out of the slot like any other)
        stats["no_pack"] += src is not None
        stats["no_unpack"] += dst is not None
        buf = st.fusion_view(dtype, sum(counts))
        if src is None:
            with span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
                np.concatenate(tensors, axis=None, out=buf)  # one C loop packs every tensor
        with span(timeline, names, "COLLECTIVE"):
            self.reduce(
                st.topology, buf if src is None else src, buf if dst is None else dst, sig, timeline, names
            )
        if dst is None:
            with span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
                _unpack(buf, counts, outputs)
        return outputs

    @staticmethod
    def _allreduce_alone(
        st: SetState,
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
        st: SetState,
        tensors: list[NDArray],
        outputs: list[NDArray],
        counts: list[int],
        dtype: np.dtype[Any],
        sig: Signature,
        timeline: Timeline | None,
        names: list[str],
    ) -> bool:
        """Reduce a fused batch of separate tensors through the node's shared-memory segment: packed straight
        into this rank's slot and unpacked straight from the reduced result, so the data is copied twice
        instead of four times. For sets on one node, with the algorithm `auto` (or `shm`), batches from
        SHM_FUSED_MIN_BYTES up to one slot. False, with nothing done, where it does not apply: the caller
        packs and runs the ring."""
        algorithm = self._state.settings.allreduce_algorithm
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
            with span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
                np.concatenate(tensors, axis=None, out=slot)

        def drain(result: NDArray) -> None:
            with span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
                _unpack(result, counts, outputs)

        finish = None if post == 1.0 else functools.partial(dtypes.scale, factor=post)
        with span(timeline, names, "COLLECTIVE"):
            kernels.shm_round(seg, total, dtype, op, fill, drain, finish)
        self._state.stats["shm"] += 1
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
        st: SetState,
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
        with span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
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
        with span(timeline, names, "COLLECTIVE"):
            self.reduce(st.topology, buf, buf, sig._replace(prescale=1.0), timeline, names)
        results: list[Any] = []
        with span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            off = 0
            for req, n in zip(reqs, counts, strict=True):
                out = None if req is None else (req.output if req.output is not None else req.tensor)
                if out is not None:
                    np.copyto(out, buf[off : off + n].reshape(out.shape))
                results.append(out)
                off += n
        return results

    # ------------------------------------------------------------------ the other data operations

    def single(self, st: SetState, r: Response, timeline: Timeline | None) -> Any:
        """allgather, broadcast, alltoall or reducescatter of this rank's request."""
        req = r.local
        assert req is not None and req.tensor is not None  # joined ranks are refused in negotiation
        with span(timeline, [r.sig.name] if timeline is not None else [], "COLLECTIVE"):
            return run_single(st.topology, r.sig, req.tensor, req.output, req.splits)


def run_single(topo: Topology, sig: Signature, tensor: NDArray, output: NDArray | None, splits: Any) -> Any:
    """allgather, broadcast (into `output`, or `tensor` in place), alltoall ((rows, received splits as
    int32)) or reducescatter of `tensor` over `topo`, with the agreed signature's arithmetic. The device
    plane's MPI route calls it on staged host copies, so both planes compute alike."""
    op = sig.op_type
    if op is OpType.ALLGATHER:
        return kernels.allgather(topo, np.ascontiguousarray(tensor))
    if op is OpType.BROADCAST:
        buf = output if output is not None else tensor
        kernels.broadcast(topo, buf, sig.root)
        return buf
    if op is OpType.ALLTOALL:
        rows = int(tensor.shape[0]) if tensor.ndim else 0
        counts = kernels.parse_splits(splits, rows, topo.size, "alltoall")
        result, received = kernels.alltoall(topo, np.ascontiguousarray(tensor), counts)
        return result, received.astype(np.int32)
    if op is OpType.REDUCESCATTER:
        src = tensor
        if sig.prescale != 1.0:
            src = src.copy()
            dtypes.scale(src, sig.prescale)
        out = kernels.reducescatter(topo, np.ascontiguousarray(src), _REDUCE_OPS[sig.reduce_op])
        dtypes.scale(out, sig.postscale)
        return out
    raise CollectiveError(f"unknown operation {op!r}")
