"""allreduce in all its forms: async, in place, grouped, differentiable (sparse: `collective_ops.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hpcring import _deps
from hpcring.collective import dtypes
from hpcring.engine import OpType, ProcessSet, Request, global_process_set
from hpcring.errors import ArgumentError
from hpcring.torch import adasum_rules, basics
from hpcring.torch.compression import Compression
from hpcring.torch.graph import run_op
from hpcring.torch.one_call import SUBMITTER, entered_in_c
from hpcring.torch.op_handles import (
    _OP_NAMES,
    ADASUM,
    _group_names,
    _name,
    _op_name,
    _Pending,
    _register,
    _submit_group,
    handle_average_backwards_compatibility,
    wait_now,
)
from hpcring.torch.tensors import (
    _STRIDED,
    PLAIN_DTYPES,
    TENSOR,
    TENSOR_ERRORS,
    _check_dtype,
    _check_scale,
    _queue,
    _shares,
    _submit,
    _view,
    fresh_output,
    group_problem,
    host_array,
    new_signature,
    require_group,
    tensor_problem,
)

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402

# ---------------------------------------------------------------------- allreduce


def _allreduce_async(
    tensor: Any,
    output: Any,
    name: str | None,
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    """Submit one allreduce of `tensor` into `output`: `tensor` itself, or `fresh_output(tensor)`.

    One path for every input. Each check answers the common case (a training loop's gradients and metrics:
    a dense contiguous CPU tensor of a plain dtype, float factors, a registered set) with its first test and
    takes its general branch, which also words the error, for anything else; a request whose memory the
    engine can use as it is goes straight to the queue, anything else through `_view` (device routes,
    staging, contiguous copies), which is where a copy back is needed."""
    what = "allreduce"
    op_name = _OP_NAMES.get(id(op))
    if op_name is None:
        op_name = _op_name(op, what)  # refuses anything but the five reduce ops
    pre = prescale_factor
    if type(pre) is not float:
        pre = _check_scale(pre, what, "prescale_factor")
    post = postscale_factor
    if type(post) is not float:
        post = _check_scale(post, what, "postscale_factor")
    dtype = PLAIN_DTYPES.get(tensor.dtype) if type(tensor) is TENSOR else None
    if dtype is None:
        dtype = _check_dtype(tensor, what)
        if op_name != ADASUM:
            dtypes.check_op(dtype, op, what)
    set_id = process_set.process_set_id if type(process_set) is ProcessSet else None
    if set_id is None:
        set_id = basics._set_id(process_set)
    data = host_array(tensor)
    if data is not None:  # the caller's own memory, viewed as it is: nothing to copy back
        if op_name == ADASUM:
            adasum_rules.check(dtype, "cpu", process_set, what)
        out = data if output is tensor else output.numpy()  # `fresh_output`: contiguous, like the input
        full = _name("allreduce", name, process_set)
        sig = new_signature((full, _ALLREDUCE, dtype, tuple(tensor.shape), op_name, -1, pre, post, "cpu", ()))
        return _register(_Pending([_queue(Request(sig, set_id, data, out))], None, output))
    src = _view(tensor)
    if op_name == ADASUM:
        adasum_rules.check(dtype, src.device, process_set, what)
    dst = src if output is tensor else _view(output)
    h = _submit(
        OpType.ALLREDUCE,
        _name("allreduce", name, process_set),
        tensor,
        process_set,
        output=dst,
        src=src,
        reduce_op=op_name,
        prescale=pre,
        postscale=post,
    )

    def finish(_: list[Any]) -> Any:
        if not _shares(dst, output):  # staged (a device, a copy): the result goes back into the output
            output.copy_(dst.tensor)
        return output

    return _register(_Pending([h], finish, [tensor, src, dst]))


_ALLREDUCE = OpType.ALLREDUCE


def allreduce_async(
    tensor: Any,
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start averaging/summing `tensor` over the ranks (the input is not modified); returns a handle."""
    output = None
    if SUBMITTER is not None and type(tensor) is TENSOR and tensor.is_cpu and tensor.layout is _STRIDED:
        output = fresh_output(tensor)  # the one-call path, as in allreduce_async_; kept if it declines
        handle = SUBMITTER.allreduce(
            tensor, output, name, op, average, prescale_factor, postscale_factor, process_set, True
        )
        if type(handle) is str:  # unnamed, numbered by the core, then left to this path: keep its number
            name = handle
        elif handle is not NotImplemented:
            return handle  # type: ignore[no-any-return]
    op = handle_average_backwards_compatibility(op, average)
    try:
        if output is None:
            output = fresh_output(tensor)
        return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)
    except TENSOR_ERRORS:
        problem = tensor_problem(tensor, "allreduce")
        if problem is None:
            raise
        raise problem from None


@entered_in_c  # the common case in one C call (one_call.py); this body for everything else
def allreduce_async_(
    tensor: Any,
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place allreduce_async: the result lands in `tensor`."""
    op = handle_average_backwards_compatibility(op, average)
    try:
        return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)
    except TENSOR_ERRORS:
        problem = tensor_problem(tensor, "allreduce")
        if problem is None:
            raise
        raise problem from None


class HorovodAllreduce(torch.autograd.Function):  # type: ignore[misc]
    """Allreduce with a gradient: the gradient is allreduced with the same op and scale factors."""

    @staticmethod
    def forward(
        ctx: Any, tensor: Any, average: Any, name: Any, op: Any, pre: float, post: float, ps: Any
    ) -> Any:
        ctx.average, ctx.op, ctx.pre, ctx.post, ctx.ps = average, op, pre, post, ps
        return wait_now(lambda: allreduce_async(tensor, average, name, op, pre, post, ps))

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        grad = allreduce(
            grad_output,
            average=ctx.average,
            op=ctx.op,
            prescale_factor=ctx.pre,
            postscale_factor=ctx.post,
            process_set=ctx.ps,
        )
        return grad, None, None, None, None, None, None


def allreduce(
    tensor: Any,
    average: Any = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Average (default) or sum `tensor` over the ranks; differentiable; the input is not modified."""
    compressed, cctx = compression.compress(tensor)
    args = (compressed, average, name, op, prescale_factor, postscale_factor, process_set)
    reduced = run_op(HorovodAllreduce, (compressed,), *args)
    return compression.decompress(reduced, cctx)


def allreduce_(
    tensor: Any,
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """In-place allreduce; returns `tensor`."""
    return wait_now(
        lambda: allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_allreduce_async(
    tensors: Sequence[Any],
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """allreduce_async of a list of tensors under one handle (fused together by the engine)."""
    return _grouped_allreduce_submit(
        allreduce_async, tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_async_(
    tensors: Sequence[Any],
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place grouped_allreduce_async."""
    return _grouped_allreduce_submit(
        allreduce_async_, tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )


def _grouped_allreduce_submit(
    single: Callable[..., int],
    tensors: Sequence[Any],
    average: Any,
    name: str | None,
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    """Submit one `single` allreduce per tensor (in place or not) as one atomic, fusable group."""
    op = handle_average_backwards_compatibility(op, average)
    # Only a list or tuple: a tensor would be taken row by row.
    if type(tensors) is not list and not isinstance(tensors, (list, tuple)):
        raise ArgumentError(
            "grouped_allreduce: argument 'tensors' must be a list or tuple of torch.Tensor, got "
            f"{type(tensors).__name__}"
        )
    try:
        names = _group_names("allreduce", name, len(tensors), process_set)
        return _submit_group(
            lambda: [
                single(t, None, n, op, prescale_factor, postscale_factor, process_set)
                for t, n in zip(tensors, names, strict=True)
            ]
        )
    except TENSOR_ERRORS:
        problem = group_problem(tensors, "grouped_allreduce")
        if problem is None:
            raise
        raise problem from None


class HorovodGroupedAllreduce(torch.autograd.Function):  # type: ignore[misc]
    """Grouped allreduce with gradients (each gradient allreduced like its tensor)."""

    @staticmethod
    def forward(
        ctx: Any, average: Any, name: Any, op: Any, pre: float, post: float, ps: Any, *tensors: Any
    ) -> Any:
        ctx.average, ctx.op, ctx.pre, ctx.post, ctx.ps = average, op, pre, post, ps
        return tuple(
            wait_now(lambda: grouped_allreduce_async(list(tensors), average, name, op, pre, post, ps))
        )

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        grads = grouped_allreduce(
            list(grad_outputs),
            average=ctx.average,
            op=ctx.op,
            prescale_factor=ctx.pre,
            postscale_factor=ctx.post,
            process_set=ctx.ps,
        )
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: Any = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[Any]:
    """Allreduce a list of tensors together; differentiable; inputs unchanged."""
    require_group(tensors, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    wire = [p[0] for p in pairs]
    reduced = run_op(
        HorovodGroupedAllreduce,
        wire,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        *wire,
    )
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[Any],
    average: Any = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[Any]:
    """In-place grouped allreduce; returns the tensors."""
    result: list[Any] = wait_now(
        lambda: grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )
    return result
