"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", arXiv 2006.02924): the
adaptive sum of the ranks' vectors, combined pairwise per tensor, as Horovod computes it.

Two vectors combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their sum when they are orthogonal, their
average when they are parallel. A coefficient whose squared norm is below sqrt(DBL_MIN) stays 1 (a zero
vector is neutral). The ranks combine in a binary tree: at level 1 rank r with r ^ 1, at level 2 the pairs'
results with the neighbouring pair's, and so on, the lower block always on the left. That tree is what
Horovod's vector-halving, distance-doubling (VHDD) schedule computes, and this module follows the same
schedule: at each level a rank keeps half of its current region (the lower half if it is the left partner)
and swaps the other half with rank ^ level, so the reduction costs what a reduce-scatter does; the regions
travel back in the reverse order (an allgather).

Adasum is not element-wise: a fused buffer holds several tensors, and each tensor's dot product and norms
cover that tensor alone, wherever its elements lie. A rank computes partial sums over the part of each
tensor in its region and adds them up with the ranks that hold the other parts (the 2 * level ranks it has
exchanged with so far, by recursive doubling, so every one of them gets the same bits). Dot products and
norms are float64; float32 and float64 are combined in float64, float16 in float32 with the coefficients
rounded to float32, each rounded once to the dtype, as Horovod's kernels do.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcring.collective.algorithms.workspace import scratch
from hpcring.collective.backends.base import Transport
from hpcring.errors import ConfigError, choices

NDArray = np.ndarray[Any, Any]

DTYPES = ("float16", "float32", "float64")  # what Horovod's Adasum reduces
DEFAULT_CHUNK_BYTES = 1 << 30  # Horovod's HOROVOD_ADASUM_MPI_CHUNK_SIZE default
_TINY = math.sqrt(sys.float_info.min)  # a squared norm below this leaves its coefficient at 1
_TAG_DATA = 0x4841  # "HA": halves of the vector
_TAG_DOTS = 0x4844  # "HD": partial dot products and norms

# extra_sum(v): add the float64 vector v in place over another group holding other parts of the same tensors
# (the node's ranks on the hierarchical route, each with its own shard).
ExtraSum = Callable[[NDArray], None]


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def allowed_sizes(limit: int) -> str:
    """The world sizes Adasum accepts, up to past `limit`, as a message lists them."""
    sizes, n = [], 1
    while n <= max(limit, 8):
        sizes.append(str(n))
        n *= 2
    return ", ".join(sizes) + ", ..."


def check_dtype(name: str, what: str) -> None:
    if name not in DTYPES:
        raise ConfigError(f"{what}: op=Adasum does not reduce {name!r} tensors; allowed: {choices(DTYPES)}")


def adasum_allreduce(
    t: Transport,
    buf: NDArray,
    counts: Sequence[int],
    *,
    extra_sum: ExtraSum | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> None:
    """Replace the 1-D `buf` (the tensors of `counts`, back to back) by the Adasum of every rank's `buf`, in
    place. The group size must be a power of two; one rank leaves `buf` as it is."""
    n, rank = t.size, t.rank
    if not is_power_of_two(n):
        raise ConfigError(
            f"Adasum needs a power-of-two number of ranks, got {n}; allowed: {allowed_sizes(n)}"
        )
    check_dtype(buf.dtype.name, "allreduce")
    if sum(counts) != buf.size:
        raise ValueError(f"counts sum to {sum(counts)}, the buffer holds {buf.size} elements")
    if n == 1:
        return
    bounds = np.concatenate(([0], np.cumsum(np.asarray(counts, dtype=np.int64))))
    chunk = max(chunk_bytes // buf.itemsize, 1)
    lo, hi = 0, int(buf.size)
    regions: list[tuple[int, int]] = []
    level = 1
    while level < n:  # vector halving: keep one half, take the partner's copy of it, combine
        left = not rank & level
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        theirs = scratch("adasum.theirs", keep[1] - keep[0], buf.dtype)  # the first level's is the largest
        _exchange(t, buf[give[0] : give[1]], theirs, rank ^ level, chunk)
        regions.append((lo, hi))
        lo, hi = keep
        _combine(t, buf[lo:hi], theirs, _overlaps(bounds, lo, hi), left, level, extra_sum)
        level <<= 1
    for plo, phi in reversed(regions):  # distance halving: the combined halves travel back
        level >>= 1
        other = (hi, phi) if lo == plo else (plo, lo)
        _exchange(t, buf[lo:hi], buf[other[0] : other[1]], rank ^ level, chunk)
        lo, hi = plo, phi


def _exchange(t: Transport, send: NDArray, recv: NDArray, peer: int, chunk: int) -> None:
    """Swap `send` for the peer's part (into `recv`) in chunks of at most `chunk` elements; both sides take
    the same number of steps (the peer's sizes are this side's, mirrored)."""
    steps = max(send.size, recv.size)
    for i in range(0, max(steps, 1), chunk):
        t.sendrecv(send[i : i + chunk], peer, recv[i : i + chunk], peer, _TAG_DATA)


def _overlaps(bounds: NDArray, lo: int, hi: int) -> NDArray:
    """Elements of each tensor inside [lo, hi)."""
    counts: NDArray = np.clip(bounds[1:], lo, hi) - np.clip(bounds[:-1], lo, hi)
    return counts


def _combine(
    t: Transport,
    mine: NDArray,
    theirs: NDArray,
    counts: NDArray,
    left: bool,
    level: int,
    extra_sum: ExtraSum | None,
) -> None:
    """mine = own coefficient * mine + partner's coefficient * theirs, per tensor, with the dot product and
    norms of each whole tensor (summed over every rank holding a part of it)."""
    held = np.flatnonzero(counts)
    starts = np.cumsum(counts) - counts
    many_small = held.size > 0 and mine.size < _SMALL_TENSOR * held.size
    sums = _partial_sums(mine, theirs, counts, held, starts, many_small)  # per tensor: a.b, |a|^2, |b|^2
    if not left:
        sums[:, [1, 2]] = sums[:, [2, 1]]  # columns 1 and 2: the left partner's norm, the right one's
    flat = sums.reshape(-1)
    if extra_sum is not None:
        extra_sum(flat)
    _block_sum(t, flat, level)
    dot, left_sq, right_sq = sums[:, 0], sums[:, 1], sums[:, 2]
    c_left = _coefficient(dot, left_sq)
    c_right = _coefficient(dot, right_sq)
    c_mine, c_theirs = (c_left, c_right) if left else (c_right, c_left)
    wide = np.float32 if mine.dtype == np.float16 else np.float64
    if many_small:  # one pass over the whole region, coefficients repeated per element
        reps = np.asarray(counts, dtype=np.int64)
        result: NDArray = mine.astype(wide) * np.repeat(c_mine.astype(wide), reps)
        np.add(result, theirs.astype(wide) * np.repeat(c_theirs.astype(wide), reps), out=result)
        mine[...] = result
        return
    for i in held:  # tensor by tensor, in blocks that stay in cache
        cm, ct = wide(c_mine[i]), wide(c_theirs[i])
        for lo, hi in _blocks(int(starts[i]), int(starts[i] + counts[i])):
            a: NDArray = mine[lo:hi].astype(wide)
            b: NDArray = theirs[lo:hi].astype(wide)
            np.multiply(a, cm, out=a)
            np.multiply(b, ct, out=b)
            np.add(a, b, out=a)
            mine[lo:hi] = a


_SMALL_TENSOR = 4096  # elements: below this on average, tensors are summed in one vectorised pass
_BLOCK = 1 << 16  # elements per block of a large tensor's arithmetic (float64 temporaries of 512 KiB)


def _blocks(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(b, min(b + _BLOCK, hi)) for b in range(lo, hi, _BLOCK)]


def _partial_sums(
    mine: NDArray, theirs: NDArray, counts: NDArray, held: NDArray, starts: NDArray, many_small: bool
) -> NDArray:
    """Per tensor, over the part in this region: (mine . theirs, |mine|^2, |theirs|^2) in float64."""
    sums = np.zeros((len(counts), 3))
    if many_small:
        a = mine.astype(np.float64, copy=False)
        b = theirs.astype(np.float64, copy=False)
        at = starts[held]
        sums[held, 0] = np.add.reduceat(a * b, at)
        sums[held, 1] = np.add.reduceat(a * a, at)
        sums[held, 2] = np.add.reduceat(b * b, at)
        return sums
    for i in held:
        for lo, hi in _blocks(int(starts[i]), int(starts[i] + counts[i])):
            a = mine[lo:hi].astype(np.float64, copy=False)
            b = theirs[lo:hi].astype(np.float64, copy=False)
            sums[i, 0] += np.einsum("i,i->", a, b)  # numpy's own loop: BLAS threads spin on busy nodes
            sums[i, 1] += np.einsum("i,i->", a, a)
            sums[i, 2] += np.einsum("i,i->", b, b)
    return sums


def _coefficient(dot: NDArray, norm_sq: NDArray) -> NDArray:
    """1 - dot / (2 |v|^2), or 1 where |v|^2 < sqrt(DBL_MIN) (Horovod's guard)."""
    big = norm_sq >= _TINY
    out = np.ones_like(dot)
    out[big] = 1.0 - dot[big] / norm_sq[big] * 0.5
    return out


def _block_sum(t: Transport, v: NDArray, level: int) -> None:
    """v = its sum over the 2 * level ranks r ^ k (k < 2 * level), by recursive doubling: each step adds the
    partner's copy, and x + y == y + x, so every rank of the block ends with the same bits."""
    other = np.empty_like(v)
    d = 1
    while d <= level:
        peer = t.rank ^ d
        t.sendrecv(v, peer, other, peer, _TAG_DOTS)
        np.add(v, other, out=v)
        d <<= 1
