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
from hpcring.engine import Handle, OpType, ProcessSet, Request, Signature, device_plane
from hpcring.engine.request import signature_shape
from hpcring.torch import basics
from hpcring.torch.op_handles import _tls

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402

# ---------------------------------------------------------------------- tensors <-> numpy


class _View:
    """A contiguous tensor and what the engine gets of it (slotted: one is built per tensor per call): a
    numpy view of its memory on the host route (`device` "cpu"), or the tensor itself on a device route
    ("cuda", or "cpu+gloo" under HPCRING_CPU_DEVICE_PLANE=gloo), which is also the agreed signature's
    device."""

    __slots__ = ("array", "device", "tensor")

    def __init__(self, tensor: Any, array: Any, device: str = "cpu") -> None:
        self.tensor = tensor
        self.array = array
        self.device = device


_dtype_names: dict[Any, str] = {}  # torch dtype -> supported dtype name (`str(dtype)` costs microseconds)


def _check_dtype(t: Any, what: str) -> str:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported here (use sparse_allreduce_async)")
    name = _dtype_names.get(t.dtype)
    if name is None:
        name = str(t.dtype).removeprefix("torch.")
        if name not in dtypes.SUPPORTED:
            raise ValueError(
                f"{what}: tensor type {t.type()} is not supported; supported dtypes: {dtypes.SUPPORTED}"
            )
        _dtype_names[t.dtype] = name
    return name


def _view(t: Any) -> _View:
    """What the engine gets of `t`: a zero-copy numpy view of a contiguous CPU tensor, the contiguous tensor
    itself on a device route, otherwise (a device without a data plane, or a dtype no device route carries)
    a staged contiguous CPU copy."""
    c = t.detach() if t.requires_grad else t
    if c.is_cpu:
        engine = basics._engine
        if engine is None or engine.settings.cpu_device_plane != "gloo":  # the host path: no route lookups
            if not c.is_contiguous():
                c = c.contiguous()
            return _View(c, numpy_view(c), "cpu")
        route = device_plane.CPU_GLOO
    else:
        route = _device_route(c.device.type)
    if route in device_plane.ROUTES:
        if c.dtype not in _HOST_ONLY:
            return _View(c if c.is_contiguous() else c.contiguous(), None, route)
        why = f"no device route carries {c.dtype} (NCCL has no such type)"
        route = "cpu" if c.is_cpu else _staged(c.device.type, why, (c.device.type, c.dtype))
    if not c.is_cpu:
        c = c.cpu()  # staged: reduced on the host, but the signature still says which device it came from
    if not c.is_contiguous():
        c = c.contiguous()
    return _View(c, numpy_view(c), route)


_HOST_ONLY = frozenset(getattr(torch, name) for name in device_plane.HOST_ONLY_DTYPES)

# device type -> "cuda" (the device plane) or "<type>+host" (staged through host memory, reduced on the host
# path; a distinct device name so that validation still refuses CPU tensors on one rank and GPU on another).
_routes: dict[str, str] = {}

_staging_warned: set[Any] = set()


def _staged(device_type: str, why: str, key: Any) -> str:
    """The route of `device_type` tensors staged through host memory, with one RuntimeWarning per `key`
    saying why (pointing at the caller of `_view`)."""
    if key not in _staging_warned:
        _staging_warned.add(key)
        warnings.warn(
            f"hpcring: {device_type} tensors are staged through host memory and reduced over MPI, "
            f"because {why}; correct, but not the GPU fast path",
            RuntimeWarning,
            4,
        )
    return f"{device_type}{device_plane.HOST_STAGED}"


def _device_route(device_type: str) -> str:
    """How tensors of a non-CPU device type travel, decided once per process (with one warning if staged)."""
    route = _routes.get(device_type)
    if route is None:
        why = None
        if device_type != "cuda":
            why = f"hpcring has no device data plane for {device_type!r} tensors (only 'cuda')"
        else:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_nccl_available()):
                why = "this torch build has no NCCL (torch.distributed.is_nccl_available() is False)"
        route = device_plane.CUDA if why is None else _staged(device_type, why, device_type)
        _routes[device_type] = route
    return route


def _hand_over(view: _View) -> None:
    """Last thing before a CUDA tensor goes to the engine thread, which works on the device's default
    stream: make that stream wait (on the GPU, an event; the CPU does not block) for the stream this thread
    produced the tensor on, and remember the device for ranks that later contribute without a tensor."""
    t = view.tensor
    device_plane.note_device(t.device)
    current = torch.cuda.current_stream(t.device)
    default = torch.cuda.default_stream(t.device)
    if current != default:
        default.wait_stream(current)


def _for_caller(t: Any) -> Any:
    """A result allocated by the engine on the default stream, now used on the caller's stream: tell the
    caching allocator, so the memory is not reused while the caller's stream may still read it."""
    if t.is_cuda:
        current = torch.cuda.current_stream(t.device)
        if current != torch.cuda.default_stream(t.device):
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
    src = _view(tensor) if src is None else src
    device = src.device
    if src.array is not None:  # the host path: "cpu", or a device's tensor staged through host memory
        dtype, data = dtypes.name_of(src.array.dtype), src.array
        out = None if output is None else output.array
    else:  # a device route: the engine gets the tensors themselves
        dtype, data = _check_dtype(src.tensor, op_type.value), src.tensor
        out = None if output is None else output.tensor
        if device == device_plane.CUDA:
            _hand_over(src)
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
    return _queue(Request(sig, set_id, data, out, splits))


def _queue(req: Request) -> Handle:
    """Hand `req` to the engine, or to the grouped call being built on this thread (`_submit_group` queues
    the group's requests together)."""
    batch: list[Request] | None = _tls.batch
    if batch is not None:
        batch.append(req)
        return req.handle
    return basics.engine().submit(req)


# ---------------------------------------------------------------------- the host route's common case

# dtype -> name for the dtypes whose tensors numpy views directly and every reduce op accepts (bool has op
# limits and bfloat16 needs ml_dtypes' view: both take the general branches).
PLAIN_DTYPES: dict[Any, str] = {
    getattr(torch, n): n for n in dtypes.SUPPORTED if n not in ("bool", "bfloat16") and hasattr(torch, n)
}
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
        and engine.settings.cpu_device_plane != "gloo"
    ):
        return t.numpy()
    return None


def _check_scale(value: Any, what: str, which: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: {which} must be a real number, got {value!r}")
    return float(value)


# Outputs from this size on are allocated with transparent huge pages requested. Fresh memory is paid for on
# first touch, one page fault per 4 KiB page, and on this VM that costs more than the reduction itself: a new
# 64 MiB tensor took 67 ms to fill against 19 ms with huge pages (benchmarks/bench_torch_ops.py). numpy
# asks for huge pages on large arrays itself; torch's CPU allocator does not (unless THP_MEM_ALLOC_ENABLE=1).
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
