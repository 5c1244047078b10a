"""Hierarchical allreduce: reduce-scatter inside the node, allreduce across nodes per shard, allgather inside.

Only 1/local_size of the buffer crosses the (slow) network per rank. The buffer is cut into S shards (S: the
largest node's rank count), the same cut on every node; local rank l of a node of L ranks owns the run
`owned_shards(l, S, L)`, so each node has one owner per shard and shard j's cross-node group
(`shard_groups[j]`) holds one rank per node. On unequal nodes a rank may own several shards; its groups run
in increasing shard order, so two blocking groups can never wait on each other.

Large buffers are pipelined over segments (docs/dev/collectives.md, "Hierarchical pipeline"): while earlier
segments cross the network (`CrossRing`, non-blocking point-to-point steps) the node reduce-scatters the next
and allgathers finished ones, so the node-local stages hide under the link time instead of adding to it. No
thread is needed: MPI progresses every pending request whenever the rank waits on any one, and the node
stages complete arrived cross steps while they wait, so the link never waits for the schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcring.collective.algorithms.chunks import (
    bounds,
    offsets,
    owned_shards,
    ring_gather_segment,
    ring_reduce_segment,
)
from hpcring.collective.algorithms.native import native_allreduce
from hpcring.collective.algorithms.ring import (
    DEFAULT_CHUNK_BYTES,
    Poll,
    done,
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
)
from hpcring.collective.algorithms.workspace import scratch
from hpcring.collective.backends.base import Request, Transport
from hpcring.collective.ops import ReduceOp, ufunc
from hpcring.collective.selection import choose_algorithm, segment_bytes
from hpcring.collective.stages import (
    CROSS_ALLREDUCE,
    INTRA_ALLGATHER,
    INTRA_REDUCE_SCATTER,
    StageHook,
    unobserved,
)

NDArray = np.ndarray[Any, Any]

# Pipeline segment: small enough that the first reduce-scatter and the last allgather (the only node-local
# work the link cannot hide) are short, large enough that per-segment overhead stays small; a size that
# suits both MPIs on the 2-node netns cluster (docs/dev/bench-netns.md, segment-size sweep).
DEFAULT_SEGMENT_BYTES = 2 << 20
# How far (in bytes of segments) a rank may run ahead of the schedule's forced cross-node waits. The two
# ranks of a node drive two TCP flows that share the link unevenly; with a deep window neither runs dry
# while its node peer catches up (docs/dev/bench-netns.md, "A deep in-flight window": it helps on a slow link
# and costs nothing on a fast one).
IN_FLIGHT_BYTES = 24 << 20
# Cross-node messages are tagged by in-flight slot: early completion makes the order in which two peers post
# steps of different segments timing-dependent, so only distinct tags keep them from matching each other.
_TAG_CROSS = 0x4860  # ring.py uses 0x4852/0x4853; MPI guarantees tags up to 32767
_MAX_SLOTS = 8192  # pipelines needing more segments in flight (thousands of nodes) run unpipelined


@dataclass(frozen=True)
class NodeLayout:
    """What the hierarchical algorithm needs to know about a topology."""

    local: Transport  # ranks on this node
    shards: int  # S: the largest node's rank count
    shard_groups: Mapping[
        int, Transport
    ]  # for each shard this rank owns: the owners of that shard, one per node


def local_counts(count: int, shards: int, local_size: int) -> list[int]:
    """Elements each local rank owns after the intra-node reduce-scatter (runs of whole shards)."""
    sb = bounds(count, shards)
    out = []
    for lr in range(local_size):
        own = owned_shards(lr, shards, local_size)
        out.append(sb[own.stop] - sb[own.start])
    return out


def flat_allreduce(t: Transport, buf: NDArray, op: ReduceOp, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
    """In-place allreduce inside one flat group (a cross-node shard group), native or ring by the same `auto`
    rule as a one-node world (selection.choose_algorithm)."""
    if t.size == 1 or buf.size == 0:
        return
    exact = t.can_reduce(buf.dtype, op)
    if choose_algorithm(buf.nbytes, native_exact=exact, local_size=1, cross_size=1) == "native":
        native_allreduce(t, buf, buf, op)
    else:
        ring_allreduce(t, buf, buf, op, chunk_bytes)


def _native_inside(local: Transport, buf: NDArray, op: ReduceOp) -> bool:
    """Use the node transport's own reduce-scatter/allgather instead of our ring? Only when the transport asks
    for it with a true `prefer_native` attribute (NCCL: its kernels beat a Python ring on GPUs); over MPI our
    ring phases measured faster and, unlike MPI's, never collapse when cores are oversubscribed."""
    return local.size > 1 and bool(getattr(local, "prefer_native", False)) and local.can_reduce(buf.dtype, op)


def segment_count(nbytes: int, count: int, seg_bytes: int) -> int:
    """How many pipeline segments a buffer of `count` items (`nbytes` bytes) is cut into; 1 = no pipeline.

    The same on every rank (it depends on the agreed size only). 0 < `seg_bytes` cuts into ceil(nbytes /
    seg_bytes) balanced segments, never more than there are items; `seg_bytes` = 0 turns pipelining off."""
    if seg_bytes <= 0 or nbytes <= seg_bytes:
        return 1
    return max(1, min(count, -(-nbytes // seg_bytes)))


def pipeline_lag(seg_bytes: int) -> int:
    """Iterations between a segment's start and the first cross step the schedule forces to complete: about
    IN_FLIGHT_BYTES of segments in flight."""
    return max(1, -(-IN_FLIGHT_BYTES // max(1, seg_bytes)))


def finish_iteration(segment: int, cross_steps: int, lag: int) -> int:
    """Pipeline iteration in which `segment`'s cross-node ring completes and its allgather runs.

    Segment k starts (node reduce-scatter, first cross messages posted) in iteration k. Its cross ring has
    `cross_steps` steps; step s (1-based) is completed in iteration k + lag + s - 1, each completion waiting
    only on messages posted in an earlier iteration, which is what makes the schedule deadlock-free: all the
    ranks of a node run the node stages of an iteration together, and whatever a rank waits for across nodes
    was already posted by its peer. With no cross steps (one node) the allgather follows at once."""
    return segment if cross_steps == 0 else segment + lag + cross_steps - 1


class CrossRing:
    """Ring allreduce of one buffer over one cross-node group, completed one step per `advance` call.

    The same schedule as `ring.ring_allreduce` (n-1 reduce-scatter steps, n-1 allgather steps; for a 2-member
    group it is one exchange of halves, a local reduction and one exchange back: link-optimal), but each step
    is a single non-blocking message per direction so the caller can do node-local work between steps. A
    step's sends are completed before the next step's receives are posted, so a receive never lands in a
    region an earlier send may still be reading.
    """

    def __init__(self, t: Transport, buf: NDArray, op: ReduceOp, slot: int, shard: int = 0) -> None:
        """Post step 0. `slot` tells in-flight segments apart (tag, scratch), `shard` one rank's groups."""
        self.t, self.buf, self.tag = t, buf, _TAG_CROSS + slot
        self.seg = bounds(buf.size, t.size)
        self.steps = 0 if t.size == 1 or buf.size == 0 else 2 * (t.size - 1)
        self.step = 0
        self.combine = ufunc(op, buf.dtype)
        self.tmp = scratch(
            f"hier.cross{slot}.{shard}",
            max(b - a for a, b in zip(self.seg, self.seg[1:], strict=False)),
            buf.dtype,
        )
        self.sends: list[Request] = []
        self.recv: Request | None = None
        self.recv_seg = -1
        if self.steps:
            self._post(0)

    def _post(self, step: int) -> None:
        """Post step `step`: receive (into scratch to reduce, or in place to gather), then send."""
        n, r, seg = self.t.size, self.t.rank, self.seg
        if step < n - 1:
            send, recv = ring_reduce_segment(r, n, step)
            into = self.tmp[: seg[recv + 1] - seg[recv]]
        else:
            send, recv = ring_gather_segment(r, n, step - (n - 1))
            into = self.buf[seg[recv] : seg[recv + 1]]
        self.recv_seg = recv
        self.recv = self.t.irecv(into, (r - 1) % n, self.tag)
        self.sends.append(self.t.isend(self.buf[seg[send] : seg[send + 1]], (r + 1) % n, self.tag))

    def ready(self) -> bool:
        """Could `advance` run now without blocking? (False if the transport's requests cannot be tested.)"""
        return (
            self.step < self.steps
            and self.recv is not None
            and done(self.recv)
            and all(done(req) for req in self.sends)
        )

    def advance(self) -> None:
        """Complete the current step (wait, reduce) and post the next one, if any."""
        assert self.recv is not None and self.step < self.steps
        n, seg, b = self.t.size, self.seg, self.recv_seg
        self.recv.wait()
        if self.step < n - 1:
            part = self.buf[seg[b] : seg[b + 1]]
            self.combine(self.tmp[: part.size], part, out=part)
        self.t.wait_all(self.sends)
        self.sends = []
        self.step += 1
        if self.step < self.steps:
            self._post(self.step)


@dataclass(frozen=True)
class _Segment:
    """One pipeline segment: its place in the buffer and the node-local split of it."""

    lo: int
    hi: int
    counts: list[int]  # elements each local rank owns of this segment after the reduce-scatter
    mine: int  # offset (in the segment) of this rank's run of shards


def _segment(layout: NodeLayout, lo: int, hi: int) -> _Segment:
    counts = local_counts(hi - lo, layout.shards, layout.local.size)
    return _Segment(lo, hi, counts, sum(counts[: layout.local.rank]))


def _node_reduce_scatter(
    local: Transport,
    src: NDArray,
    dst: NDArray,
    s: _Segment,
    op: ReduceOp,
    chunk_bytes: int,
    in_place: bool,
    poll: Poll | None = None,
) -> None:
    """Stage 1 on one segment: this rank's run of shards, reduced over the node, lands in place in dst."""
    sv, dv = src[s.lo : s.hi], dst[s.lo : s.hi]
    mine = dv[s.mine : s.mine + s.counts[local.rank]]
    if local.size == 1:
        if not in_place:
            dv[...] = sv
    elif _native_inside(local, sv, op):
        out = mine if not in_place else scratch("hier.rs", s.counts[local.rank], src.dtype)
        local.reduce_scatter(sv, out, s.counts, op)
        if out is not mine:
            mine[...] = out
    else:  # our ring, any dtype: several times faster than Open MPI's (docs/dev/collectives.md)
        ring_reduce_scatter(local, sv, mine, offsets(s.counts), op, chunk_bytes, poll)


def _node_allgather(
    local: Transport, dst: NDArray, s: _Segment, op: ReduceOp, chunk_bytes: int, poll: Poll | None = None
) -> None:
    """Stage 3 on one segment (our ring: MPI_Allgatherv is erratic across MPIs)."""
    dv = dst[s.lo : s.hi]
    if _native_inside(local, dv, op):
        local.allgatherv(dv, s.counts)
    else:
        ring_allgather(local, dv, offsets(s.counts), max(1, chunk_bytes // dst.dtype.itemsize), poll)


def _slots(layout: NodeLayout, lag: int) -> int:
    """Segments that can be in flight at once (each needs its own tag and scratch): a segment's cross ring
    lives from its start to its last step, lag + 2(N-1) - 1 iterations later."""
    return lag + 2 * (_cross_size(layout) - 1) + 1


def _pipelinable(layout: NodeLayout, lag: int) -> bool:
    """Is there anything to overlap? Only with several nodes (a cross stage) and a node of several ranks (a
    node stage); on one node the pipeline would only add messages. Decided from what every rank agrees on
    (the largest node's size, the node count), never from this node's own size. A transport that asks for
    its own collectives (`prefer_native`, e.g. NCCL on device buffers) keeps the one-after-another stages:
    the pipeline reduces with numpy between point-to-point steps."""
    if layout.shards == 1 or _cross_size(layout) == 1 or _slots(layout, lag) > _MAX_SLOTS:
        return False
    groups = [layout.local, *layout.shard_groups.values()]
    return not any(getattr(t, "prefer_native", False) for t in groups)


def hierarchical_allreduce(
    layout: NodeLayout,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    seg_bytes: int | None = None,
    stages: StageHook = unobserved,
) -> None:
    """dst = reduction of every rank's src (1-D; dst may be src). `seg_bytes`: pipeline segment size (None:
    $HPCRING_HIER_SEGMENT_BYTES or DEFAULT_SEGMENT_BYTES; 0: no pipelining). `stages` hears when each of
    the three stages begins and ends."""
    count = src.size
    if count == 0:
        return
    seg_bytes = segment_bytes(DEFAULT_SEGMENT_BYTES) if seg_bytes is None else seg_bytes
    k = segment_count(src.nbytes, count, seg_bytes)
    lag = pipeline_lag(seg_bytes)
    if k == 1 or not _pipelinable(layout, lag):
        _one_after_another(layout, src, dst, op, chunk_bytes, stages)
    else:
        _pipelined(layout, src, dst, op, chunk_bytes, k, lag, stages)


def _one_after_another(
    layout: NodeLayout, src: NDArray, dst: NDArray, op: ReduceOp, chunk_bytes: int, stages: StageHook
) -> None:
    """The three stages on the whole buffer, one after another (small buffers: fewest messages)."""
    local = layout.local
    s = _segment(layout, 0, src.size)
    stages(INTRA_REDUCE_SCATTER, True)
    _node_reduce_scatter(local, src, dst, s, op, chunk_bytes, dst is src)
    stages(INTRA_REDUCE_SCATTER, False)
    # 2) inter-node allreduce of each owned shard, in increasing shard order on every rank.
    stages(CROSS_ALLREDUCE, True)
    sb = bounds(src.size, layout.shards)
    for shard in sorted(layout.shard_groups):
        flat_allreduce(layout.shard_groups[shard], dst[sb[shard] : sb[shard + 1]], op, chunk_bytes)
    stages(CROSS_ALLREDUCE, False)
    stages(INTRA_ALLGATHER, True)
    _node_allgather(local, dst, s, op, chunk_bytes)
    stages(INTRA_ALLGATHER, False)


def _pipelined(
    layout: NodeLayout,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    chunk_bytes: int,
    k: int,
    lag: int,
    stages: StageHook,
) -> None:
    """Segments through the three stages, overlapped (see `finish_iteration` for the schedule).

    The schedule fixes when a cross step must be complete at the latest; a step whose messages have already
    arrived is completed earlier, whenever this rank waits for anything (`poll`, called from the node
    stages' waits), so the next step's messages go on the link without waiting for the schedule. Completing
    early only ever posts sends sooner and never blocks, so the deadlock argument is untouched.

    Stages (`stages`) span each stage's first to last segment: they overlap, which is the point."""
    local, in_place = layout.local, dst is src
    cut = bounds(src.size, k)
    segments = [_segment(layout, cut[i], cut[i + 1]) for i in range(k)]
    steps = 2 * (_cross_size(layout) - 1)
    slots = _slots(layout, lag)
    rings: dict[int, list[CrossRing]] = {}

    def poll() -> None:
        for in_flight in rings.values():
            for ring in in_flight:
                while ring.ready():
                    ring.advance()

    stages(INTRA_REDUCE_SCATTER, True)
    for it in range(finish_iteration(k - 1, steps, lag) + 1):
        if it < k:
            s = segments[it]
            _node_reduce_scatter(local, src, dst, s, op, chunk_bytes, in_place, poll)
            if it == 0:
                stages(CROSS_ALLREDUCE, True)
            if it == k - 1:
                stages(INTRA_REDUCE_SCATTER, False)
            sb = bounds(s.hi - s.lo, layout.shards)
            rings[it] = [
                CrossRing(layout.shard_groups[j], dst[s.lo + sb[j] : s.lo + sb[j + 1]], op, it % slots, j)
                for j in sorted(layout.shard_groups)
            ]
        # Steps due by now (any order is deadlock-free: each waits on messages posted in earlier iterations).
        for seg in sorted(rings, reverse=True):
            due = min(steps, it - seg - lag + 1)
            for ring in rings[seg]:
                while ring.step < min(due, ring.steps):
                    ring.advance()
        finished = [seg for seg in sorted(rings) if finish_iteration(seg, steps, lag) == it]
        for seg in finished:
            del rings[seg]
            if seg == k - 1:  # the last cross ring has landed
                stages(CROSS_ALLREDUCE, False)
            if seg == 0:
                stages(INTRA_ALLGATHER, True)
            _node_allgather(local, dst, segments[seg], op, chunk_bytes, poll)
    stages(INTRA_ALLGATHER, False)


def _cross_size(layout: NodeLayout) -> int:
    """Members of every cross-node shard group (one rank per node: the same for every group)."""
    return next(iter(layout.shard_groups.values())).size if layout.shard_groups else 1
