"""The data operations: allreduce, allgather, broadcast, alltoall, reducescatter, barrier.

Each call (1) looks at the input through a zero-copy numpy view, (2) checks its own arguments, (3) unless
`validate=False` agrees a small signature with the other ranks (see validate.py), then (4) runs an algorithm
on flat 1-D views. Results come back in the caller's kind: numpy in, numpy out; tensor in, tensor out.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcring.collective import dtypes, runtime, selection
from hpcring.collective.algorithms.chunks import offsets, part_sizes
from hpcring.collective.algorithms.hierarchical import hierarchical_allreduce
from hpcring.collective.algorithms.native import native_allreduce
from hpcring.collective.algorithms.ring import DEFAULT_CHUNK_BYTES, ring_allreduce, ring_reduce_scatter
from hpcring.collective.algorithms.shm import Finish, shm_allreduce
from hpcring.collective.arrays import Buffer, as_buffer, is_tensor, to_kind
from hpcring.collective.ops import ReduceOp, parse_op
from hpcring.collective.selection import SHM_MIN_RANKS, choose_algorithm, chunk_bytes, resolve_algorithm
from hpcring.collective.topology import Topology
from hpcring.collective.validate import Signature, prepare
from hpcring.errors import ConfigError, choices

NDArray = np.ndarray[Any, Any]


def _topo(topology: Topology | None) -> Topology:
    return runtime.topology() if topology is None else topology


def _factor(value: object, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{what}: {name} must be a finite real number, got {value!r}")
    return float(value)


def _rows_and_trailing(buf: Buffer, what: str) -> tuple[int, tuple[int, ...]]:
    shape = buf.array.shape
    if not shape:
        raise ConfigError(f"{what}: needs an array with at least one dimension, got a 0-d (scalar) input")
    return int(shape[0]), tuple(int(d) for d in shape[1:])


def _flat(arr: NDArray) -> NDArray:
    return arr.reshape(-1)


def run_allreduce(
    topo: Topology,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    algorithm: str,
    chunk: int | None = None,
    shm_min_ranks: int = SHM_MIN_RANKS,
    shm_round_bytes: int | None = None,
    finish: Finish | None = None,
) -> str:
    """Run one algorithm on flat views (no validation; dst may be src); returns the one used after `auto`.

    `chunk` is the ring's pipelining chunk in bytes (default: $HPCRING_RING_CHUNK_BYTES, read per call; the
    engine reads it once and passes it). Native allreduces MPI can do exactly go straight to the transport:
    this is the path of every small engine operation, where each avoided check is latency. `shm_min_ranks`:
    the fewest ranks on one node for which `auto` takes shared memory (selection.choose_algorithm);
    `shm_round_bytes`: the largest round through it (default: one slot, $HPCRING_SHM_SLOT_BYTES). `finish`
    (AVERAGE's or a postscale's scaling, element-wise) is applied to the result: by shared memory to each
    part by its owner inside the round (1/n of the buffer per rank), by the others to all of dst after."""
    t = topo.transport()
    algorithm = pick_allreduce(topo, src, op, algorithm, shm_min_ranks)
    if algorithm == "shm":
        if shared_memory_allreduce(topo, src, dst, op, shm_round_bytes, finish):
            return algorithm
        algorithm = "ring"
    if algorithm == "native":
        if not _exact(t, src.dtype, op) or not src.size:
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
            hierarchical_allreduce(topo.node_layout(), src, dst, op, chunk)
    if finish is not None:
        finish(dst)
    return algorithm


def pick_allreduce(
    topo: Topology, src: NDArray, op: ReduceOp, algorithm: str, shm_min_ranks: int = SHM_MIN_RANKS
) -> str:
    """The algorithm `run_allreduce` runs for `algorithm` ("auto" resolved by the pure rule, from the layout
    as every rank sees it: unequal nodes count as the largest)."""
    if algorithm != "auto":
        return algorithm
    return choose_algorithm(
        src.nbytes,
        native_exact=_exact(topo.transport(), src.dtype, op),
        local_size=max(topo.node_sizes),
        cross_size=len(topo.node_sizes),
        shm_min_ranks=shm_min_ranks,
    )


_shm_warned: set[str] = set()


def shared_memory_allreduce(
    topo: Topology,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    round_bytes: int | None = None,
    finish: Finish | None = None,
) -> bool:
    """The `shm` algorithm on flat views (in rounds of at most `round_bytes`, when given, with `finish` on
    each reduced part); False (after one warning per reason, with nothing done) where this group cannot
    share memory, and the caller runs the ring instead. A ConfigError if the group spans several nodes."""
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
        message = f"hpcring: shared-memory allreduce unavailable ({why}); using the ring"
        warnings.warn(message, RuntimeWarning, 2)
    return False


# Transport.can_reduce answers by transport kind, dtype and op; asked on every allreduce, so remembered.
_EXACT: dict[tuple[type, np.dtype[Any], int], bool] = {}


def _exact(t: Any, dtype: np.dtype[Any], op: ReduceOp) -> bool:
    """Cached `t.can_reduce(dtype, op)` (keyed by the op's identity: hashing an Enum member runs Python)."""
    key = (type(t), dtype, id(op))
    exact = _EXACT.get(key)
    if exact is None:
        exact = _EXACT[key] = bool(t.can_reduce(dtype, op))
    return exact


def allreduce(
    x: Any,
    op: ReduceOp | str = ReduceOp.SUM,
    *,
    out: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    algorithm: str | None = None,
    topology: Topology | None = None,
    validate: bool = True,
) -> Any:
    """Reduce `x` over all ranks; the result has x's shape and dtype. `out=x` reduces in place.

    AVERAGE is SUM scaled by 1/size (integers: truncated toward zero). `prescale_factor` multiplies the input
    before the reduction, `postscale_factor` the result after it.
    """
    what = "allreduce"
    topo = _topo(topology)

    def check() -> tuple[Signature, tuple[Buffer, Buffer | None, ReduceOp, str, float, float]]:
        rop = parse_op(op)
        alg = resolve_algorithm(algorithm)
        pre = _factor(prescale_factor, "prescale_factor", what)
        post = _factor(postscale_factor, "postscale_factor", what)
        buf = as_buffer(x, what)
        name = dtypes.check_dtype(buf.array.dtype, what)
        dtypes.check_op(name, rop, what)
        if name == "bool" and (pre != 1.0 or post != 1.0):
            raise ConfigError(f"{what}: scale factors apply to numeric dtypes only, not bool")
        obuf = None
        if out is not None and out is not x:
            obuf = as_buffer(out, f"{what} out")
            if obuf.array.shape != buf.array.shape or obuf.array.dtype != buf.array.dtype:
                raise ConfigError(
                    f"{what}: out has shape {obuf.array.shape} and dtype {obuf.array.dtype}; it must "
                    f"match the input's shape {buf.array.shape} and dtype {buf.array.dtype}"
                )
        sig = {
            "dtype": name,
            "shape": buf.array.shape,
            "op": rop.name,
            "prescale_factor": pre,
            "postscale_factor": post,
            "algorithm": alg,
        }
        return sig, (buf, obuf, rop, alg, pre, post)

    (buf, obuf, rop, alg, pre, post), _ = prepare(topo.transport(), what, validate, check)
    src = _flat(buf.array)
    if out is x:
        dst = src
    elif obuf is not None:
        dst = _flat(obuf.array)
    else:
        result = np.empty_like(buf.array)
        dst = _flat(result)
    if pre != 1.0:
        if dst is not src:
            dst[...] = src
        dtypes.scale(dst, pre)
        src = dst
    finish: Finish | None = None
    if rop is ReduceOp.AVERAGE:
        finish = functools.partial(dtypes.average, n=topo.size, postscale=post)
    elif post != 1.0:
        finish = functools.partial(dtypes.scale, factor=post)
    run_allreduce(topo, src, dst, rop, alg, finish=finish)
    if out is x:
        buf.writeback()
        return x
    if obuf is not None:
        obuf.writeback()
        return out
    return buf.wrap(result)


def allgather(x: Any, *, topology: Topology | None = None, validate: bool = True) -> Any:
    """Concatenate every rank's `x` along dimension 0 (which may differ per rank), in rank order."""
    what = "allgather"
    topo = _topo(topology)
    t = topo.transport()

    def check() -> tuple[Signature, tuple[Buffer, int, tuple[int, ...]]]:
        buf = as_buffer(x, what)
        name = dtypes.check_dtype(buf.array.dtype, what)
        rows, trailing = _rows_and_trailing(buf, what)
        return {"dtype": name, "trailing dimensions": trailing, "_rows": rows}, (buf, rows, trailing)

    (buf, rows, trailing), sigs = prepare(t, what, validate, check)
    all_rows = (
        [int(s["_rows"]) for s in sigs] if sigs is not None else [int(r) for r in t.allgather_object(rows)]
    )
    row_elems = math.prod(trailing)
    result = np.empty((sum(all_rows), *trailing), dtype=buf.array.dtype)
    t.allgatherv(_flat(result), [r * row_elems for r in all_rows], sendbuf=_flat(buf.array))
    return buf.wrap(result)


def broadcast(x: Any, root: int = 0, *, topology: Topology | None = None, validate: bool = True) -> Any:
    """Overwrite `x` on every rank with root's `x` (in place); returns `x`."""
    what = "broadcast"
    topo = _topo(topology)
    t = topo.transport()

    def check() -> tuple[Signature, Buffer]:
        if isinstance(root, bool) or not isinstance(root, numbers.Integral) or not 0 <= int(root) < t.size:
            raise ConfigError(
                f"{what}: root {root!r} is out of range; allowed: an integer from 0 to {t.size - 1}"
            )
        buf = as_buffer(x, what)
        name = dtypes.check_dtype(buf.array.dtype, what)
        return {"dtype": name, "shape": buf.array.shape, "root": int(root)}, buf

    buf, _ = prepare(t, what, validate, check)
    if buf.array.size:
        t.bcast(_flat(buf.array), int(root))
    buf.writeback()
    return x


def _parse_splits(splits: Any, rows: int, size: int, what: str) -> list[int]:
    """Validate alltoall splits: one non-negative count per rank summing to dim 0 (None: equal parts)."""
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


def alltoall(
    x: Any, splits: Any = None, *, topology: Topology | None = None, validate: bool = True
) -> tuple[Any, Any]:
    """Send rows [sum(splits[:j]), +splits[j]) of `x` to rank j; returns (received rows, received splits).

    The received splits come back as int32, a numpy array or a tensor following `x` (Horovod's convention).
    """
    what = "alltoall"
    topo = _topo(topology)
    t = topo.transport()

    def check() -> tuple[Signature, tuple[Buffer, list[int], tuple[int, ...]]]:
        buf = as_buffer(x, what)
        name = dtypes.check_dtype(buf.array.dtype, what)
        rows, trailing = _rows_and_trailing(buf, what)
        counts = _parse_splits(splits, rows, t.size, what)
        return {"dtype": name, "trailing dimensions": trailing}, (buf, counts, trailing)

    (buf, counts, trailing), _ = prepare(t, what, validate, check)
    ones = [1] * t.size
    received = np.empty(t.size, dtype=np.int64)
    t.alltoallv(np.asarray(counts, dtype=np.int64), ones, received, ones)
    row_elems = math.prod(trailing)
    result = np.empty((int(received.sum()), *trailing), dtype=buf.array.dtype)
    t.alltoallv(
        _flat(buf.array),
        [c * row_elems for c in counts],
        _flat(result),
        [int(c) * row_elems for c in received],
    )
    return buf.wrap(result), to_kind(received.astype(np.int32), torch_like=buf.is_torch)


def reducescatter(
    x: Any,
    op: ReduceOp | str = ReduceOp.SUM,
    *,
    topology: Topology | None = None,
    validate: bool = True,
) -> Any:
    """Reduce `x` over all ranks and give rank r its part of dimension 0: dim0 // size rows, plus one for
    ranks < dim0 % size. Ops: SUM or AVERAGE."""
    what = "reducescatter"
    topo = _topo(topology)
    t = topo.transport()

    def check() -> tuple[Signature, tuple[Buffer, ReduceOp, int, tuple[int, ...]]]:
        rop = parse_op(op)
        if rop not in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise ConfigError(f"{what}: op {rop.name} is not supported; allowed: 'SUM' or 'AVERAGE'")
        buf = as_buffer(x, what)
        name = dtypes.check_dtype(buf.array.dtype, what)
        dtypes.check_op(name, rop, what)
        rows, trailing = _rows_and_trailing(buf, what)
        return {"dtype": name, "shape": buf.array.shape, "op": rop.name}, (buf, rop, rows, trailing)

    (buf, rop, rows, trailing), _ = prepare(t, what, validate, check)
    row_elems = math.prod(trailing)
    counts = [r * row_elems for r in part_sizes(rows, t.size)]
    result = np.empty((part_sizes(rows, t.size)[t.rank], *trailing), dtype=buf.array.dtype)
    src, dst = _flat(buf.array), _flat(result)
    if t.can_reduce(src.dtype, rop) and src.nbytes < selection.NATIVE_REDUCE_SCATTER_MAX_BYTES:
        t.reduce_scatter(src, dst, counts, rop)
    else:
        ring_reduce_scatter(t, src, dst, offsets(counts), rop, chunk_bytes(DEFAULT_CHUNK_BYTES))
    if rop is ReduceOp.AVERAGE:
        dtypes.average(dst, t.size)
    return buf.wrap(result)


def barrier(*, topology: Topology | None = None) -> None:
    """Block until every rank of the group has called barrier."""
    _topo(topology).transport().barrier()
