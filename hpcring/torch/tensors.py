"""Tensors to engine requests: the zero-copy numpy view of a CPU tensor (or the tensor itself on a device
route, or a staged host copy), the request's signature, and the submit."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from hpcring import _deps
from hpcring.collective import dtypes
from hpcring.collective.arrays import numpy_view, to_kind
from hpcring.engine import Handle, OpType, ProcessSet, Request, Signature, device_routes
from hpcring.engine.request import signature_shape
from hpcring.errors import ArgumentError
from hpcring.torch import basics
from hpcring.torch.op_handles import _tls

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402

# ---------------------------------------------------------------------- tensors <-> numpy


class _View:
    """A contiguous tensor and what the engine gets of it (slotted: one is built per tensor per call): a
    numpy view of its memory on the host route (`device` "cpu"), or the tensor itself on a device route
    (`device_routes.ROUTES`), which is also the agreed signature's device."""

    __slots__ = ("array", "device", "tensor")

    def __init__(self, tensor: Any, array: Any, device: str = "cpu") -> None:
        self.tensor = tensor
        self.array = array
        self.device = device


# torch dtype -> name, for the dtypes whose tensors numpy views directly and every reduce op accepts (bool
# has op limits and bfloat16 needs ml_dtypes' view: both take the general branches).
PLAIN_DTYPES: dict[Any, str] = {
    getattr(torch, n): n for n in dtypes.SUPPORTED if n not in ("bool", "bfloat16") and hasattr(torch, n)
}
# torch dtype -> supported dtype name: the plain ones, and the others once `_check_dtype` has seen them
# (`str(dtype)` costs microseconds).
_dtype_names: dict[Any, str] = dict(PLAIN_DTYPES)


def tensor_problem(t: Any, what: str, arg: str = "tensor", layout: Any = None) -> ArgumentError | None:
    """What is wrong with `t` as argument `arg` of `what`, if it is not a torch.Tensor of `layout` (default:
    dense, torch.strided): the error names the argument and what it takes."""
    wanted = torch.strided if layout is None else layout
    if not isinstance(t, torch.Tensor):
        kind = "a sparse COO torch.Tensor" if wanted is torch.sparse_coo else "a torch.Tensor"
        return ArgumentError(f"{what}: argument {arg!r} must be {kind}, got {type(t).__name__}")
    if t.layout is wanted:
        return None
    has, takes = str(t.layout).removeprefix("torch."), str(wanted).removeprefix("torch.")
    hint = ""
    if t.layout is torch.sparse_coo and what in ("allreduce", "grouped_allreduce"):
        hint = "; for sparse gradients: sparse_allreduce_async or DistributedOptimizer(sparse_as_dense=True)"
    elif wanted is torch.strided:
        hint = "; convert it with .to_dense()"
    takes = "dense (strided)" if wanted is torch.strided else takes
    return ArgumentError(f"{what}: argument {arg!r} has layout {has}; {what} takes {takes} tensors{hint}")


def group_problem(tensors: Any, what: str) -> ArgumentError | None:
    """`tensor_problem` for a group: not a list or tuple, or the first element that is not a dense tensor."""
    if not isinstance(tensors, (list, tuple)):
        got = type(tensors).__name__
        return ArgumentError(f"{what}: argument 'tensors' must be a list or tuple of torch.Tensor, got {got}")
    for i, t in enumerate(tensors):
        problem = tensor_problem(t, what, f"tensors[{i}]")
        if problem is not None:
            return problem
    return None


def require(t: Any, what: str, arg: str = "tensor", layout: Any = None) -> None:
    """Raise `tensor_problem`'s error, if any (where a check up front costs nothing that matters)."""
    problem = tensor_problem(t, what, arg, layout)
    if problem is not None:
        raise problem


def require_group(tensors: Any, what: str) -> None:
    """Raise `group_problem`'s error, if any."""
    problem = group_problem(tensors, what)
    if problem is not None:
        raise problem


# What a collective's fast path raises when given a non-tensor or a layout it does not take: the entry points
# then ask `tensor_problem`/`group_problem` for the error that names the argument (the fast path stays as
# it is: a `try` costs nothing until something raises).
TENSOR_ERRORS = (TypeError, ValueError, RuntimeError, AttributeError)


def _check_dtype(t: Any, what: str, arg: str = "tensor") -> str:
    problem = tensor_problem(t, what, arg)
    if problem is not None:
        raise problem
    name = _dtype_names.get(t.dtype)
    if name is None:
        name = str(t.dtype).removeprefix("torch.")
        if name not in dtypes.SUPPORTED:
            raise ValueError(
                f"{what}: tensor type {t.type()} is not supported; supported dtypes: {dtypes.SUPPORTED}"
            )
        _dtype_names[t.dtype] = name
    return name


def _view(t: Any, op: OpType = OpType.ALLREDUCE) -> _View:
    """What the engine gets of `t` for collective `op`: a zero-copy numpy view of a contiguous CPU tensor
    (the host route), the contiguous tensor itself on a device route (`device_routes.py`), otherwise (a
    device type without a data plane) a staged contiguous CPU copy."""
    c = t.detach() if t.requires_grad else t
    if c.is_cpu:
        engine = basics._engine
        plane = "off" if engine is None else engine.settings.cpu_device_plane
        if plane == "off":  # the host route: no route lookups
            if not c.is_contiguous():
                c = c.contiguous()
            return _View(c, numpy_view(c), "cpu")
        route = device_routes.STAND_INS[plane]
    else:
        route = _device_route(c.device.type, op)
    if route in device_routes.ROUTES:
        if c.dtype in _NO_GROUP and route in device_routes.MPI_ROUTE_OF:
            route = device_routes.MPI_ROUTE_OF[route]  # int16: no process group carries it, MPI does
        return _View(c if c.is_contiguous() else c.contiguous(), None, route)
    c = c.cpu()  # staged: reduced on the host, but the signature still says which device it came from
    if not c.is_contiguous():
        c = c.contiguous()
    return _View(c, numpy_view(c), route)


_NO_GROUP = frozenset(getattr(torch, name) for name in device_routes.NO_GROUP_DTYPES)

# (device type, op, init generation) -> "cuda", "cuda+mpi" or "<type>+host" (staged by the caller, reduced on
# the host path; a device name of its own, so validation still refuses CPU tensors next to GPU ones).
_routes: dict[tuple[str, OpType, int], str] = {}

_warned: set[Any] = set()


def _warn_once(key: Any, message: str) -> None:
    """One RuntimeWarning per `key`, pointing at the caller of the public op."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"hpcring: {message}", RuntimeWarning, 5)


def _device_route(device_type: str, op: OpType = OpType.ALLREDUCE) -> str:
    """How `op`'s tensors of a non-CPU device type travel, decided once per process: CUDA tensors by NCCL or
    over MPI (`HOROVOD_GPU_OPERATIONS`, `HOROVOD_GPU_<OP>`, or a torch without NCCL, with one warning);
    other device types staged through host memory by the caller (one warning)."""
    key = (device_type, op, basics._generation)  # a new init() may have other GPU settings
    route = _routes.get(key)
    if route is None:
        route = _routes[key] = _choose_route(device_type, op)
    return route


def _choose_route(device_type: str, op: OpType) -> str:
    if device_type != "cuda":
        _warn_once(
            device_type,
            f"{device_type} tensors are staged through host memory and reduced over MPI, because hpcring "
            f"has no device data plane for {device_type!r} tensors (only 'cuda'); correct, but not fast",
        )
        return f"{device_type}{device_routes.HOST_STAGED}"
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        _warn_once(
            "no-nccl",
            "CUDA tensors are staged through pinned host memory and reduced over MPI, because this torch "
            "build has no NCCL (torch.distributed.is_nccl_available() is False)",
        )
        return device_routes.CUDA_MPI
    carrier = basics.engine().settings.gpu_carrier(op.value)
    return device_routes.CUDA if carrier == "nccl" else device_routes.CUDA_MPI


def _ready(view: _View) -> Any:
    """The event a CUDA tensor's batch waits for before it reads the tensor: recorded on the stream this
    thread produced it on (the GPU waits; the CPU does not). Also remembers the device, for ranks that later
    contribute without a tensor."""
    t = view.tensor
    device_routes.note_device(t.device)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(t.device))
    return event


def _for_caller(t: Any) -> Any:
    """A result the engine allocated on a communication stream, now used on the caller's stream: tell the
    caching allocator, so the memory is not reused while the caller's stream may still read it."""
    if t.is_cuda:
        current = torch.cuda.current_stream(t.device)
        t.record_stream(current)
    return t


def _shares(view: _View, t: Any) -> bool:
    """Is the engine's tensor the caller's own memory (nothing to copy back)?"""
    v = view.tensor
    return v is t or bool(v.data_ptr() == t.data_ptr() and v.device == t.device)


def _tensor_of(arr: Any, like: Any) -> Any:
    """The engine's result as a tensor on `like`'s device (device routes return tensors already)."""
    if isinstance(arr, torch.Tensor):
        return _for_caller(arr)
    out = to_kind(arr, torch_like=True)
    return out if like.device.type == "cpu" else out.to(like.device)


def _submit(
    op_type: OpType,
    name: str,
    tensor: Any,
    process_set: ProcessSet | None,
    *,
    output: _View | None = None,
    src: _View | None = None,
    splits: np.ndarray[Any, Any] | None = None,
    reduce_op: str = "",
    root: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> Handle:
    set_id = basics._set_id(process_set)
    src = _view(tensor, op_type) if src is None else src
    device = src.device
    ready = None
    if src.array is not None:  # the host path: "cpu", or a device's tensor staged through host memory
        dtype, data = dtypes.name_of(src.array.dtype), src.array
        out = None if output is None else output.array
    else:  # a device route: the engine gets the tensors themselves
        dtype, data = _dtype_names[src.tensor.dtype], src.tensor  # every caller checked the dtype
        out = None if output is None else output.tensor
        if data.is_cuda:
            ready = _ready(src)
    sig = Signature(  # positional: keyword arguments cost a NamedTuple call twice as much
        name,
        op_type,
        dtype,
        signature_shape(op_type, tuple(tensor.shape)),
        reduce_op,
        root,
        float(prescale),
        float(postscale),
        device,
    )
    return _queue(Request(sig, set_id, data, out, splits, ready=ready))


def _queue(req: Request) -> Handle:
    """Hand `req` to the engine, or to the grouped call being built on this thread (`_submit_group` queues
    the group's requests together)."""
    batch: list[Request] | None = _tls.batch
    if batch is not None:
        batch.append(req)
        return req.handle
    return basics.engine().submit(req)


# ---------------------------------------------------------------------- the host route's common case

_STRIDED = torch.strided
TENSOR = torch.Tensor
# A Signature from one tuple, built in C (the NamedTuple's generated __new__ is a Python call): the tuple
# carries every field, in order.
new_signature = functools.partial(tuple.__new__, Signature)


def host_array(t: Any) -> Any:
    """The zero-copy numpy view of a dense, contiguous CPU tensor of a plain dtype (`PLAIN_DTYPES`) that
    needs no gradient, when the host route carries CPU tensors; None for anything else (the caller then
    takes `_view`, which handles every other case)."""
    engine = basics._engine
    if (
        t.is_cpu
        and t.layout is _STRIDED
        and not t.requires_grad
        and t.is_contiguous()
        and t.dtype in PLAIN_DTYPES
        and engine is not None
        and engine.cpu_tensors_on_host
    ):
        return t.numpy()
    return None


def _check_scale(value: Any, what: str, which: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: {which} must be a real number, got {value!r}")
    return float(value)


# Outputs from this size on are allocated with transparent huge pages requested. Fresh memory is paid for on
# first touch, one page fault per 4 KiB page, which can cost more than the reduction itself
# (docs/dev/engine.md, "Out-of-place allreduce"). numpy asks for huge pages on large arrays itself; torch's
# CPU allocator does not (unless THP_MEM_ALLOC_ENABLE=1).
HUGE_PAGE_MIN_BYTES = 4 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h
_madvise: Any = None


def fresh_output(t: Any) -> Any:
    """A new contiguous tensor like `t`, for a result the engine writes in full: on the CPU, from
    HUGE_PAGE_MIN_BYTES on, its memory is marked for transparent huge pages before anything touches it
    (where the kernel offers them: `madvise` mode or `always`; elsewhere the hint is ignored)."""
    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    nbytes = out.numel() * out.element_size()
    if out.is_cpu and nbytes >= HUGE_PAGE_MIN_BYTES:
        _advise_huge_pages(out.data_ptr(), nbytes)
    return out


def _advise_huge_pages(ptr: int, nbytes: int) -> None:
    global _madvise
    if _madvise is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise = fn
        except (OSError, AttributeError):  # not Linux: no hint
            _madvise = False
    if _madvise is False:
        return
    page = 4096
    start = (ptr + page - 1) & ~(page - 1)  # madvise wants page-aligned ranges inside the allocation
    end = (ptr + nbytes) & ~(page - 1)
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a refusal changes nothing
