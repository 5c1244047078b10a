"""Bandwidth-optimal ring allreduce and reduce-scatter over point-to-point transfers.

Allreduce = reduce-scatter (n-1 steps) + allgather (n-1 steps); every rank sends and receives 2(n-1)/n of the
buffer, the minimum for any allreduce. Each segment travels in chunks, and a chunk is forwarded to the right
neighbour as soon as it has been reduced (or received, in the allgather), so the next rank starts working on
it while this one reduces the following chunk: the ring is a pipeline, not n-1 lockstep phases. Reductions run
in numpy in the buffer's own dtype with `out=`, so float16/bfloat16 are added as themselves, nothing allocates
per call (scratch comes from `workspace`), and an out-of-place call never copies the input first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcring.collective.algorithms.chunks import (
    bounds,
    chunk_ranges,
    ring_gather_segment,
    ring_reduce_segment,
)
from hpcring.collective.algorithms.workspace import scratch
from hpcring.collective.backends.base import Request, Transport
from hpcring.collective.ops import ReduceOp, ufunc

NDArray = np.ndarray[Any, Any]
DEFAULT_CHUNK_BYTES = 1 << 20
_TAG_RS = 0x4852  # "HR": reduce-scatter phase
_TAG_AG = 0x4853  # allgather phase

# store(segment, step) -> where the reduction of `segment` computed at `step` goes (its length matches).
Store = Callable[[int, int], NDArray]
# poll() -> None: other work to drive while this ring waits (the hierarchical pipeline's cross-node steps).
Poll = Callable[[], None]


def done(req: Request) -> bool:
    """Has `req` completed? Uses the request's optional non-blocking `test()`; a request without one (a
    transport that cannot test) reports False, so callers fall back to a blocking wait."""
    test = getattr(req, "test", None)
    return bool(test()) if test is not None else False


def _wait(req: Request, poll: Poll | None) -> None:
    """Wait for `req`; with `poll`, call it until the request completes instead of blocking inside MPI (both
    progress every pending MPI request, but polling also lets the caller post new work meanwhile)."""
    if poll is not None and hasattr(req, "test"):
        while not done(req):
            poll()
    else:
        req.wait()


def _wait_all(t: Transport, reqs: list[Request], poll: Poll | None) -> None:
    if poll is None:
        t.wait_all(reqs)
    else:
        for req in reqs:
            _wait(req, poll)


def _reduce_scatter_phase(
    t: Transport,
    src: NDArray,
    seg: list[int],
    op: ReduceOp,
    chunk: int,
    store: Store,
    poll: Poll | None = None,
) -> None:
    """Run the n-1 reduce-scatter steps; then `store(t.rank, n-2)` holds segment t.rank fully reduced.

    The chunk layout of a segment is the same on every rank (`chunk_ranges` of the same bounds), and MPI keeps
    messages between two ranks with one tag in order, so the k-th receive always matches the k-th send.
    """
    n, r = t.size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    combine = ufunc(op, src.dtype)
    maxseg = max(seg[i + 1] - seg[i] for i in range(n))
    recv_bufs = [scratch("ring.recv0", maxseg, src.dtype), scratch("ring.recv1", maxseg, src.dtype)]

    def post_recvs(step: int) -> list[tuple[Request, NDArray, int, int]]:
        _, b = ring_reduce_segment(r, n, step)
        buf, base = recv_bufs[step % 2], seg[b]
        out = []
        for lo, hi in chunk_ranges(seg[b], seg[b + 1], chunk):
            view = buf[lo - base : hi - base]
            out.append((t.irecv(view, left, _TAG_RS), view, lo, hi))
        return out

    pending: list[list[Request]] = [[], []]  # sends reading from the store of step s, by s % 2
    upcoming = post_recvs(0)
    first, _ = ring_reduce_segment(r, n, 0)
    pending[1] = [
        t.isend(src[lo:hi], right, _TAG_RS) for lo, hi in chunk_ranges(seg[first], seg[first + 1], chunk)
    ]
    for step in range(n - 1):
        recvs = upcoming
        if step + 1 < n - 1:
            upcoming = post_recvs(step + 1)
        _wait_all(t, pending[step % 2], poll)  # the store of step-2 may alias this step's store
        pending[step % 2] = []
        _, b = ring_reduce_segment(r, n, step)
        dest, base = store(b, step), seg[b]
        for req, buf, lo, hi in recvs:
            _wait(req, poll)
            out = dest[lo - base : hi - base]
            combine(buf, src[lo:hi], out=out)
            if step + 1 < n - 1:
                pending[step % 2].append(t.isend(out, right, _TAG_RS))
    _wait_all(t, pending[0] + pending[1], poll)


def ring_allgather(t: Transport, dst: NDArray, seg: list[int], chunk: int, poll: Poll | None = None) -> None:
    """In-place allgather: rank r owns [seg[r], seg[r+1]) of dst; every chunk is forwarded on arrival.

    Used by the allreduce and inside the node by the hierarchical algorithm: MPICH's MPI_Allgatherv collapses
    on oversubscribed cores, where this does not (docs/dev/collectives.md). `poll`: see `_wait`."""
    if t.size == 1:
        return
    n, r = t.size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    recvs: list[list[tuple[Request, int, int]]] = []
    for step in range(n - 1):
        _, b = ring_gather_segment(r, n, step)
        recvs.append(
            [
                (t.irecv(dst[lo:hi], left, _TAG_AG), lo, hi)
                for lo, hi in chunk_ranges(seg[b], seg[b + 1], chunk)
            ]
        )
    sends = [t.isend(dst[lo:hi], right, _TAG_AG) for lo, hi in chunk_ranges(seg[r], seg[r + 1], chunk)]
    for step in range(n - 1):
        for req, lo, hi in recvs[step]:
            _wait(req, poll)
            if step + 1 < n - 1:
                sends.append(t.isend(dst[lo:hi], right, _TAG_AG))
    _wait_all(t, sends, poll)


def ring_allreduce(
    t: Transport, src: NDArray, dst: NDArray, op: ReduceOp, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> None:
    """dst = reduction over the group of every rank's src (1-D, same size; dst may be src). `op` is reduced
    with its base operator: AVERAGE's scaling is the caller's job."""
    n = t.size
    if n == 1 or src.size == 0:
        if dst is not src:
            dst[...] = src
        return
    seg = bounds(src.size, n)
    chunk = max(1, chunk_bytes // src.dtype.itemsize)
    _reduce_scatter_phase(t, src, seg, op, chunk, lambda b, _step: dst[seg[b] : seg[b + 1]])
    ring_allgather(t, dst, seg, chunk)


def ring_reduce_scatter(
    t: Transport,
    src: NDArray,
    out: NDArray,
    seg: list[int],
    op: ReduceOp,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    poll: Poll | None = None,
) -> None:
    """out = reduction of segment `t.rank` ([seg[r], seg[r+1]) of src) over the group. src is left
    untouched. `poll`: see `_wait`."""
    n, r = t.size, t.rank
    if n == 1:
        out[...] = src[seg[0] : seg[1]]
        return
    if seg[-1] == 0:
        return
    chunk = max(1, chunk_bytes // src.dtype.itemsize)
    maxseg = max(seg[i + 1] - seg[i] for i in range(n))
    partial = [scratch("ring.partial0", maxseg, src.dtype), scratch("ring.partial1", maxseg, src.dtype)]

    def store(b: int, step: int) -> NDArray:
        if step == n - 2:
            assert b == r
            return out
        return partial[step % 2][: seg[b + 1] - seg[b]]

    _reduce_scatter_phase(t, src, seg, op, chunk, store, poll)
