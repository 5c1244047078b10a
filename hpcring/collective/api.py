"""The data operations: allreduce, allgather, broadcast, alltoall, reducescatter, barrier.

Each call (1) looks at the input through a zero-copy numpy view, (2) checks its own arguments, (3) unless
`validate=False` agrees a small signature with the other ranks (`crosscheck.py`), then (4) runs the
unchecked collective (`kernels.py`) on flat 1-D views. Results come back in the caller's kind: numpy in,
numpy out; tensor in, tensor out.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import numpy as np

from hpcring.collective import dtypes, kernels, runtime
from hpcring.collective.algorithms.shm import Finish
from hpcring.collective.arrays import Buffer, as_buffer, to_kind
from hpcring.collective.crosscheck import Signature, prepare
from hpcring.collective.ops import ReduceOp, parse_op
from hpcring.collective.selection import resolve_algorithm
from hpcring.collective.topology import Topology
from hpcring.errors import ConfigError

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
    kernels.allreduce(topo, src, dst, rop, alg, finish=finish)
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

    (buf, _rows, _trailing), sigs = prepare(t, what, validate, check)
    known = [int(s["_rows"]) for s in sigs] if sigs is not None else None
    return buf.wrap(kernels.allgather(topo, buf.array, known))


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
    kernels.broadcast(topo, buf.array, int(root))
    buf.writeback()
    return x


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
        counts = kernels.parse_splits(splits, rows, t.size, what)
        return {"dtype": name, "trailing dimensions": trailing}, (buf, counts, trailing)

    (buf, counts, _trailing), _ = prepare(t, what, validate, check)
    result, received = kernels.alltoall(topo, buf.array, counts)
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

    (buf, rop, _rows, _trailing), _ = prepare(t, what, validate, check)
    return buf.wrap(kernels.reducescatter(topo, buf.array, rop))


def barrier(*, topology: Topology | None = None) -> None:
    """Block until every rank of the group has called barrier."""
    _topo(topology).transport().barrier()
