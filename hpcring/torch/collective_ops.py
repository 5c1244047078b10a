"""allgather, broadcast, alltoall, reducescatter and the sparse allreduce (an allgather), with Horovod's
names, defaults and autograd rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcring import _deps
from hpcring.collective import dtypes
from hpcring.engine import OpType, ProcessSet, global_process_set
from hpcring.torch import basics
from hpcring.torch.allreduce_ops import allreduce
from hpcring.torch.compression import Compression
from hpcring.torch.graph import run_op
from hpcring.torch.op_handles import (
    _OPS,
    Average,
    HorovodInternalError,
    Sum,
    _group_names,
    _name,
    _Pending,
    _register,
    _submit_group,
    synchronize,
    wait_now,
)
from hpcring.torch.tensors import (
    _check_dtype,
    _check_scale,
    _shares,
    _submit,
    _tensor_of,
    _view,
    fresh_output,
    require,
    require_group,
)

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402

# ---------------------------------------------------------------------- allgather


def allgather_async(
    tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start concatenating `tensor` from every rank along dim 0 (which may differ per rank)."""
    what = "allgather"
    _check_dtype(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what}: the tensor needs at least one dimension (got a scalar)")
    src = _view(tensor, OpType.ALLGATHER)
    h = _submit(OpType.ALLGATHER, _name("allgather", name, process_set), tensor, process_set, src=src)
    return _register(_Pending([h], lambda r: _tensor_of(r[0], tensor), [tensor, src]))


class HorovodAllgather(torch.autograd.Function):  # type: ignore[misc]
    """Allgather with a gradient: the Average-allreduced gradient, sliced at this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, name: Any, ps: Any) -> Any:
        ctx.dim, ctx.ps = tensor.shape[0], ps
        return wait_now(lambda: allgather_async(tensor, name, ps))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.ps)
        dims = allgather(torch.IntTensor([ctx.dim]), process_set=ctx.ps)
        r = ctx.ps.rank()
        offset = int(dims[:r].sum().item()) if r else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    """Concatenation of every rank's `tensor` along dim 0; differentiable."""
    require(tensor, "allgather")
    return run_op(HorovodAllgather, (tensor,), tensor, name, process_set)


def grouped_allgather_async(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """allgather_async of a list of tensors under one handle."""
    require_group(tensors, "grouped_allgather")
    names = _group_names("allgather", name, len(tensors), process_set)
    return _submit_group(
        lambda: [allgather_async(t, n, process_set) for t, n in zip(tensors, names, strict=True)]
    )


class HorovodGroupedAllgather(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, name: Any, ps: Any, *tensors: Any) -> Any:
        ctx.dims, ctx.ps = [t.shape[0] for t in tensors], ps
        return tuple(wait_now(lambda: grouped_allgather_async(list(tensors), name, ps)))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        out = [
            HorovodAllgather.backward(_Ctx(dim=d, ps=ctx.ps), g)[0]
            for d, g in zip(ctx.dims, grads, strict=True)
        ]
        return (None, None, *out)


@dataclass
class _Ctx:
    dim: int
    ps: Any


def grouped_allgather(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet = global_process_set
) -> tuple[Any, ...]:
    """Allgather a list of tensors together; differentiable. A tuple, as Horovod's (autograd's) result."""
    require_group(tensors, "grouped_allgather")
    return tuple(run_op(HorovodGroupedAllgather, tensors, name, process_set, *tensors))


# ---------------------------------------------------------------------- broadcast


def _root_index(root_rank: Any, process_set: ProcessSet, what: str) -> int:
    ps = global_process_set if process_set is None else process_set
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise ValueError(f"{what}: root_rank must be an int, got {root_rank!r}")
    ranks = ps.ranks if ps.process_set_id else list(range(basics.size()))
    if root_rank not in ranks:
        raise ValueError(f"{what}: root_rank {root_rank} is not a rank of the process set (ranks {ranks})")
    return ranks.index(root_rank)


def _broadcast_async(
    tensor: Any, output: Any, root_rank: int, name: str | None, process_set: ProcessSet
) -> int:
    what = "broadcast"
    _check_dtype(tensor, what)
    root = _root_index(root_rank, process_set, what)
    out = _view(output, OpType.BROADCAST)
    if output is not tensor:
        out.tensor.copy_(tensor.detach())
    h = _submit(
        OpType.BROADCAST,
        _name("broadcast", name, process_set),
        tensor,
        process_set,
        src=out,
        output=out,
        root=root,
    )

    def finish(_: list[Any]) -> Any:
        if not _shares(out, output):
            output.copy_(out.tensor)
        return output

    return _register(_Pending([h], finish, [tensor, out]))


def broadcast_async(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start broadcasting root_rank's `tensor` (a world rank, as Horovod); the input is not modified."""
    require(tensor, "broadcast")
    output = fresh_output(tensor)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """In-place broadcast_async."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):  # type: ignore[misc]
    """Broadcast with a gradient: Average-allreduced, kept on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, root_rank: int, name: Any, ps: Any) -> Any:
        ctx.root_rank, ctx.ps = root_rank, ps
        return wait_now(lambda: broadcast_async(tensor, root_rank, name, ps))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.ps)
        if basics.rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """root_rank's `tensor` on every rank; differentiable; the input is not modified."""
    return run_op(HorovodBroadcast, (tensor,), tensor, root_rank, name, process_set)


def broadcast_(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """In-place broadcast; returns `tensor`."""
    return wait_now(lambda: broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------------- alltoall


def _splits(splits: Any, rows: int, n: int, what: str) -> np.ndarray[Any, Any] | None:
    if splits is None:
        if rows % n:
            raise ValueError(
                f"{what}: without splits, dim 0 ({rows}) must be divisible by the number of ranks ({n})"
            )
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError(f"{what}: splits must be an int32 tensor, got {splits.dtype}")
        values = [int(v) for v in splits.detach().cpu().reshape(-1).tolist()]
    elif isinstance(splits, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in splits
    ):
        values = [int(v) for v in splits]
    else:
        raise ValueError(
            f"{what}: splits must be an int32 tensor or a list of ints, got {type(splits).__name__}"
        )
    if len(values) != n:
        raise ValueError(f"{what}: splits has {len(values)} entries; it needs one per rank ({n})")
    if any(v < 0 for v in values):
        raise ValueError(f"{what}: splits must not be negative, got {values}")
    if sum(values) != rows:
        raise ValueError(f"{what}: splits sum to {sum(values)} but the tensor's dim 0 is {rows}")
    return np.asarray(values, dtype=np.int32)


def alltoall_async(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start an alltoall: rank i sends splits[j] rows to rank j (equal parts without splits).

    synchronize() returns (output, received_splits).
    """
    what = "alltoall"
    _check_dtype(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what}: the tensor needs at least one dimension (got a scalar)")
    n = basics.size() if process_set is None or not process_set.process_set_id else (process_set.size() or 0)
    split_arr = _splits(splits, int(tensor.shape[0]), n, what)
    src = _view(tensor, OpType.ALLTOALL)
    h = _submit(
        OpType.ALLTOALL, _name("alltoall", name, process_set), tensor, process_set, src=src, splits=split_arr
    )

    def finish(results: list[Any]) -> Any:
        out, received = results[0]
        rec = (
            received
            if isinstance(received, torch.Tensor)
            else torch.from_numpy(np.asarray(received, np.int32))
        )
        return _tensor_of(out, tensor), rec.to(torch.int32)

    return _register(_Pending([h], finish, [tensor, src]))


class HorovodAlltoall(torch.autograd.Function):  # type: ignore[misc]
    """Alltoall with a gradient: alltoall of the gradient with the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, splits: Any, name: Any, ps: Any) -> Any:
        ctx.ps = ps
        output, received = wait_now(lambda: alltoall_async(tensor, splits, name, ps))
        ctx.recvsplits = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad_output: Any, grad_received: Any) -> Any:
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.recvsplits, process_set=ctx.ps)
        return grad, None, None, None


def alltoall(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Scatter slices of `tensor` to every rank and gather theirs; differentiable.

    Returns the output tensor, or (output, received_splits) when `splits` is given (as Horovod).
    """
    output, received = run_op(HorovodAlltoall, (tensor,), tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---------------------------------------------------------------------- reducescatter


def _reducescatter_async(
    tensor: Any, name: str | None, op: Any, process_set: ProcessSet, pre: Any, post: Any, prefix: str
) -> int:
    what = "reducescatter"
    dtype = _check_dtype(tensor, what)
    if op not in (Average, Sum):  # Horovod's engine refuses it at enqueue: HorovodInternalError, at once
        raise HorovodInternalError(f"{what}: op must be hvd.Average or hvd.Sum, got {op!r}")
    if tensor.dim() == 0:
        raise ValueError(f"{what}: the tensor needs at least one dimension (got a scalar)")
    dtypes.check_op(dtype, op, what)
    src = _view(tensor, OpType.REDUCESCATTER)
    h = _submit(
        OpType.REDUCESCATTER,
        _name(prefix, name, process_set),
        tensor,
        process_set,
        src=src,
        reduce_op=_OPS[op],
        prescale=_check_scale(pre, what, "prescale_factor"),
        postscale=_check_scale(post, what, "postscale_factor"),
    )
    return _register(_Pending([h], lambda r: _tensor_of(r[0], tensor), [tensor, src]))


def reducescatter_async(
    tensor: Any,
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing `tensor` over the ranks and scattering dim 0: rank r gets its block of rows
    (dim0 // size rows, one more on ranks < dim0 % size)."""
    return _reducescatter_async(
        tensor, name, op, process_set, prescale_factor, postscale_factor, "reducescatter"
    )


class HorovodReducescatter(torch.autograd.Function):  # type: ignore[misc]
    """Reducescatter with a gradient: allgather of the gradient, times the set's size for Sum (Horovod's
    convention: its test_horovod_reducescatter_grad expects `size` for Sum and 1 for Average), times the
    scale factors."""

    @staticmethod
    def forward(ctx: Any, tensor: Any, name: Any, op: Any, ps: Any, pre: float, post: float) -> Any:
        ctx.op, ctx.ps, ctx.scale = op, ps, float(pre) * float(post)
        return wait_now(lambda: reducescatter_async(tensor, name, op, ps, pre, post))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        grad = allgather(grad_output.contiguous(), process_set=ctx.ps)
        scale = ctx.scale * (_set_size(ctx.ps) if ctx.op == Sum else 1)
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


def _set_size(ps: ProcessSet | None) -> int:
    if ps is None or not ps.process_set_id:
        return basics.size()
    return ps.size() or 0


def reducescatter(
    tensor: Any,
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reduce `tensor` over the ranks (Average by default) and return this rank's block of rows."""
    compressed, cctx = compression.compress(tensor)
    args = (compressed, name, op, process_set, prescale_factor, postscale_factor)
    out = run_op(HorovodReducescatter, (compressed,), *args)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(
    tensors: Sequence[Any],
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """reducescatter_async of a list of tensors under one handle."""
    require_group(tensors, "grouped_reducescatter")
    names = _group_names("reducescatter", name, len(tensors), process_set)
    return _submit_group(
        lambda: [
            reducescatter_async(t, n, op, process_set, prescale_factor, postscale_factor)
            for t, n in zip(tensors, names, strict=True)
        ]
    )


class HorovodGroupedReducescatter(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, name: Any, op: Any, ps: Any, pre: float, post: float, *tensors: Any) -> Any:
        ctx.op, ctx.ps, ctx.scale = op, ps, float(pre) * float(post)
        return tuple(wait_now(lambda: grouped_reducescatter_async(list(tensors), name, op, ps, pre, post)))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        scale = ctx.scale * (_set_size(ctx.ps) if ctx.op == Sum else 1)
        out = grouped_allgather([g.contiguous() for g in grads], process_set=ctx.ps)
        return (None, None, None, None, None, *[g * scale if scale != 1.0 else g for g in out])


def grouped_reducescatter(
    tensors: Sequence[Any],
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """Reducescatter a list of tensors together; differentiable."""
    require_group(tensors, "grouped_reducescatter")
    pairs = [compression.compress(t) for t in tensors]
    wire = [p[0] for p in pairs]
    outs = run_op(
        HorovodGroupedReducescatter, wire, name, op, process_set, prescale_factor, postscale_factor, *wire
    )
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs, strict=True)]


def sparse_allreduce_async(
    tensor: Any, name: str | None, op: Any, process_set: ProcessSet = global_process_set
) -> Any:
    """Allreduce of a sparse COO tensor by allgathering its indices and values (Horovod's method).

    Returns a callable: calling it (or passing it to synchronize) waits and gives the reduced sparse tensor.
    """
    require(tensor, "sparse_allreduce_async", layout=torch.sparse_coo)
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_handle = allgather_async(
        t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices", process_set=process_set
    )
    values_handle = allgather_async(t._values(), name=f"{name}.values", process_set=process_set)
    n = process_set.size() or 1

    def handle() -> Any:
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / n
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())

    return handle
