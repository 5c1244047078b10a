"""The collectives without checks: what the engine calls once every rank has agreed on the arguments.

`api.py` checks a direct call's arguments, agrees them across ranks, then calls these. The engine negotiates
and validates its requests itself and calls these straight away: this module is the engine's door into the
collective floor (besides the value modules ops, dtypes, arrays, topology and stages), and re-exports the
few algorithm pieces the engine drives itself. Everything here works on flat numpy views over a `Topology`
and does not validate.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcring.collective import dtypes, selection
from hpcring.collective.algorithms import adasum as _adasum
from hpcring.collective.algorithms.adasum import ExtraSum, is_power_of_two
from hpcring.collective.algorithms.chunks import offsets, part_sizes
from hpcring.collective.algorithms.hierarchical import (
    DEFAULT_SEGMENT_BYTES,
    flat_allreduce,
    hierarchical_allreduce,
)
from hpcring.collective.algorithms.native import native_allreduce
from hpcring.collective.algorithms.ring import DEFAULT_CHUNK_BYTES, ring_allreduce, ring_reduce_scatter
from hpcring.collective.algorithms.shm import SLOT_ENV, Finish, shm_allreduce, shm_round, slot_limit
from hpcring.collective.arrays import is_tensor
from hpcring.collective.backends.nccl import TorchTransport
from hpcring.collective.ops import ReduceOp
from hpcring.collective.progress import wait_polled
from hpcring.collective.selection import (
    CHUNK_ENV,
    HIERARCHICAL_MIN_BYTES,
    SEGMENT_ENV,
    SHM_MIN_RANKS,
    choose_algorithm,
    chunk_bytes,
    env_bytes,
    segment_bytes,
)
from hpcring.collective.stages import StageHook, unobserved
from hpcring.collective.topology import Topology
from hpcring.errors import ConfigError, choices

NDArray = np.ndarray[Any, Any]

__all__ = [
    "ADASUM_DTYPES",
    "DEFAULT_CHUNK_BYTES",
    "HIERARCHICAL_MIN_BYTES",
    "Finish",
    "TorchTransport",
    "adasum_allreduce",
    "adasum_sizes",
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "chunk_bytes",
    "flat_allreduce",
    "is_power_of_two",
    "parse_splits",
    "part_sizes",
    "pick_allreduce",
    "reducescatter",
    "shm_round",
    "slot_limit",
    "wait_polled",
    "wire_settings",
]


def wire_settings(chunk: int, shm_slot: int) -> tuple[tuple[str, Any], ...]:
    """(variable, value) of the collective floor's settings that decide what goes over the wire: every
    rank must use the same (the engine checks it at start)."""
    return (
        (CHUNK_ENV, chunk),
        (SEGMENT_ENV, segment_bytes(DEFAULT_SEGMENT_BYTES)),
        (SLOT_ENV, shm_slot),
        (ADASUM_CHUNK_ENVS[1], adasum_chunk_bytes()),
    )


ADASUM_DTYPES = _adasum.DTYPES
# Adasum's point-to-point exchanges go in messages of at most this many bytes (Horovod's variable: some MPIs
# fail on messages over 2 GiB); the HPCRING_ name wins when both are set.
ADASUM_CHUNK_ENVS = ("HPCRING_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_ADASUM_MPI_CHUNK_SIZE")


def adasum_chunk_bytes() -> int:
    """The Adasum exchange's message size: $HPCRING_ADASUM_MPI_CHUNK_SIZE, else Horovod's name, else 1 GiB."""
    for name in ADASUM_CHUNK_ENVS:
        if os.environ.get(name, "").strip():
            return env_bytes(name, _adasum.DEFAULT_CHUNK_BYTES, 1, "a positive number of bytes")
    return _adasum.DEFAULT_CHUNK_BYTES


def adasum_sizes(limit: int) -> str:
    """The group sizes Adasum accepts, as an error message lists them."""
    return _adasum.allowed_sizes(limit)


def adasum_allreduce(
    topo: Topology,
    buf: NDArray,
    counts: Sequence[int],
    group: str = "world",
    extra_sum: ExtraSum | None = None,
) -> None:
    """`buf` (1-D; the tensors of `counts` back to back) replaced in place by the Adasum over `group` of
    `topo` ('world', or 'cross' for the device plane's node-aware route, with `extra_sum` adding each
    level's dot products over the node's ranks)."""
    _adasum.adasum_allreduce(
        topo.transport(group), buf, counts, extra_sum=extra_sum, chunk_bytes=adasum_chunk_bytes()
    )


# Transport.can_reduce answers by transport kind, dtype and op; asked on every allreduce, so remembered.
_EXACT: dict[tuple[type, np.dtype[Any], int], bool] = {}


def exact(t: Any, dtype: np.dtype[Any], op: ReduceOp) -> bool:
    """Cached `t.can_reduce(dtype, op)` (keyed by the op's identity: hashing an Enum member runs Python)."""
    key = (type(t), dtype, id(op))
    known = _EXACT.get(key)
    if known is None:
        known = _EXACT[key] = bool(t.can_reduce(dtype, op))
    return known


def pick_allreduce(
    topo: Topology, src: NDArray, op: ReduceOp, algorithm: str, shm_min_ranks: int = SHM_MIN_RANKS
) -> str:
    """The algorithm `allreduce` runs for `algorithm` ("auto" resolved by the pure rule, from the layout as
    every rank sees it: unequal nodes count as the largest)."""
    if algorithm != "auto":
        return algorithm
    return choose_algorithm(
        src.nbytes,
        native_exact=exact(topo.transport(), src.dtype, op),
        local_size=max(topo.node_sizes),
        cross_size=len(topo.node_sizes),
        shm_min_ranks=shm_min_ranks,
    )


def largest_native(node_sizes: Sequence[int], algorithm: str, shm_min_ranks: int, limit: int) -> int:
    """The largest message, at most `limit` bytes, that `allreduce` hands to the transport's own allreduce
    under `algorithm` for an exactly reducible dtype on this layout; -1 when it never does (another algorithm
    is configured). `auto` has one threshold per layout, found by bisection of its own rule."""
    if algorithm == "native":
        return limit
    if algorithm != "auto":
        return -1

    def native(nbytes: int) -> bool:
        picked = choose_algorithm(
            nbytes,
            native_exact=True,
            local_size=max(node_sizes),
            cross_size=len(node_sizes),
            shm_min_ranks=shm_min_ranks,
        )
        return picked == "native"

    if native(limit):
        return limit
    low, high = 0, limit  # native(low), not native(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if native(mid) else (low, mid)
    return low


def mpi_reduction(t: Any, dtype: np.dtype[Any], op: ReduceOp) -> tuple[Any, Any] | None:
    """The mpi4py datatype and op of a native allreduce of `dtype` under `op` on transport `t`, when `t` is
    MPI's and reduces them exactly; else None."""
    from hpcring.collective.backends.mpi import MPITransport

    if not isinstance(t, MPITransport) or not exact(t, dtype, op):
        return None
    return t.reduction(dtype, op)


def allreduce(
    topo: Topology,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    algorithm: str,
    chunk: int | None = None,
    shm_min_ranks: int = SHM_MIN_RANKS,
    shm_round_bytes: int | None = None,
    finish: Finish | None = None,
    stages: StageHook = unobserved,
) -> str:
    """Run one algorithm on flat views (dst may be src); returns the one used after `auto`.

    `chunk`: the ring's pipelining chunk in bytes (None: read from the environment). Native allreduces the
    transport does exactly go straight to it. `shm_min_ranks`: the fewest ranks on one node for which `auto`
    takes shared memory; `shm_round_bytes`: the largest round through it (None: one slot). `finish`
    (AVERAGE's or a postscale's scaling) is applied to the result: by shared memory to each part by its owner
    inside the round, by the others to all of dst after. `stages` hears the hierarchical stages."""
    t = topo.transport()
    algorithm = pick_allreduce(topo, src, op, algorithm, shm_min_ranks)
    if algorithm == "shm":
        if shared_memory_allreduce(topo, src, dst, op, shm_round_bytes, finish):
            return algorithm
        algorithm = "ring"
    if algorithm == "native":
        if not exact(t, src.dtype, op) or not src.size:
            native_allreduce(t, src, dst, op)  # widening, or nothing to do
        elif dst is src:
            t.allreduce(dst, op)
        else:
            t.allreduce(dst, op, sendbuf=src)
    else:
        chunk = chunk_bytes(DEFAULT_CHUNK_BYTES) if chunk is None else chunk
        if algorithm == "ring":
            ring_allreduce(t, src, dst, op, chunk)
        else:
            hierarchical_allreduce(topo.node_layout(), src, dst, op, chunk, stages=stages)
    if finish is not None:
        finish(dst)
    return algorithm


_shm_warned: set[str] = set()


def shared_memory_allreduce(
    topo: Topology,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    round_bytes: int | None = None,
    finish: Finish | None = None,
) -> bool:
    """The `shm` algorithm (in rounds of at most `round_bytes`, with `finish` on each reduced part); False
    (after one warning per reason, with nothing done) where this group cannot share memory, and the caller
    runs the ring instead. A ConfigError if the group spans several nodes."""
    seg = topo.shared_segment()
    if seg is None:
        if topo.size == 1:
            if dst is not src:
                dst[...] = src
            if finish is not None:
                finish(dst)
            return True
        allowed = choices(a for a in selection.ALGORITHMS if a != "shm")
        raise ConfigError(
            f"allreduce algorithm 'shm' needs every rank on one node, but this group spans "
            f"{len(topo.node_sizes)} nodes; allowed here: {allowed}"
        )
    if shm_allreduce(seg, src, dst, op, round_bytes, finish):
        return True
    why = seg.unavailable or "unknown"
    if why not in _shm_warned:
        _shm_warned.add(why)
        warnings.warn(
            f"hpcring: shared-memory allreduce unavailable ({why}); using the ring", RuntimeWarning, 3
        )
    return False


def allgather(topo: Topology, x: NDArray, rows: Sequence[int] | None = None) -> NDArray:
    """Every rank's `x` concatenated along dimension 0 in rank order; `rows`: every rank's row count when
    the caller already knows them (else one small exchange)."""
    t = topo.transport()
    trailing = x.shape[1:]
    every = [int(r) for r in (t.allgather_object(int(x.shape[0])) if rows is None else rows)]
    row = math.prod(trailing)
    result = np.empty((sum(every), *trailing), dtype=x.dtype)
    t.allgatherv(result.reshape(-1), [r * row for r in every], sendbuf=x.reshape(-1))
    return result


def broadcast(topo: Topology, x: NDArray, root: int) -> None:
    """Overwrite `x` (contiguous) with root's, in place."""
    if x.size:
        topo.transport().bcast(x.reshape(-1), root)


def parse_splits(splits: Any, rows: int, size: int, what: str) -> list[int]:
    """alltoall's splits checked: one non-negative count per rank summing to dimension 0 (None: equal
    parts). ConfigError naming what is wrong otherwise."""
    if splits is None:
        if rows % size:
            raise ConfigError(
                f"{what}: dimension 0 ({rows}) is not divisible by the {size} ranks; pass splits "
                "(one row count per rank, summing to dimension 0)"
            )
        return [rows // size] * size
    if is_tensor(splits):
        splits = splits.tolist()
    values = np.asarray(splits).reshape(-1).tolist() if isinstance(splits, np.ndarray) else splits
    if not isinstance(values, Sequence) or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values
    ):
        raise ConfigError(f"{what}: splits must be a sequence of integers (one per rank), got {splits!r}")
    counts = [int(v) for v in values]
    if len(counts) != size:
        raise ConfigError(f"{what}: splits has {len(counts)} entries; allowed: exactly one per rank ({size})")
    if any(c < 0 for c in counts):
        raise ConfigError(f"{what}: splits {counts} has negative entries; allowed: counts >= 0")
    if sum(counts) != rows:
        raise ConfigError(
            f"{what}: splits {counts} sum to {sum(counts)}; they must sum to dimension 0 ({rows})"
        )
    return counts


def alltoall(topo: Topology, x: NDArray, counts: Sequence[int]) -> tuple[NDArray, NDArray]:
    """Rows [sum(counts[:j]), +counts[j]) of `x` to rank j; returns (received rows, received counts as
    int64)."""
    t = topo.transport()
    ones = [1] * t.size
    received = np.empty(t.size, dtype=np.int64)
    t.alltoallv(np.asarray(counts, dtype=np.int64), ones, received, ones)
    trailing = x.shape[1:]
    row = math.prod(trailing)
    result = np.empty((int(received.sum()), *trailing), dtype=x.dtype)
    t.alltoallv(
        x.reshape(-1), [c * row for c in counts], result.reshape(-1), [int(c) * row for c in received]
    )
    return result, received


def reducescatter(topo: Topology, x: NDArray, op: ReduceOp) -> NDArray:
    """Reduce `x` over the ranks (SUM or AVERAGE) and return this rank's part of dimension 0: dim0 // size
    rows, plus one for ranks < dim0 % size."""
    t = topo.transport()
    trailing = x.shape[1:]
    row = math.prod(trailing)
    parts = part_sizes(int(x.shape[0]), t.size)
    counts = [p * row for p in parts]
    result = np.empty((parts[t.rank], *trailing), dtype=x.dtype)
    src, dst = x.reshape(-1), result.reshape(-1)
    if exact(t, src.dtype, op) and src.nbytes < selection.NATIVE_REDUCE_SCATTER_MAX_BYTES:
        t.reduce_scatter(src, dst, counts, op)
    else:
        ring_reduce_scatter(t, src, dst, offsets(counts), op, chunk_bytes(DEFAULT_CHUNK_BYTES))
    if op is ReduceOp.AVERAGE:
        dtypes.average(dst, t.size)
    return result
