"""Broadcast and gather helpers of `horovod.torch.functions`: parameters, optimizer state, Python objects.

They are what makes every rank start from the same point: a training script broadcasts rank 0's parameters
and optimizer state once, then lets `DistributedOptimizer` keep them identical. Objects travel as pickles
inside uint8 tensors so they use the same engine (and transport) as the tensors themselves.

`broadcast_optimizer_state` differs from Horovod's on purpose: Horovod wraps each scalar in a float tensor
and cannot handle LBFGS, `None` options or tuples such as Adam's `betas`; here rank 0's whole `state_dict()`
is sent (its tensors as tensors, everything else as one pickle) and loaded on the other ranks, so every
`torch.optim` optimizer works and every value keeps its type. Unlike Horovod it does not run a zero-gradient
`step()` to create missing state, so parameters are never touched (a weight-decay step would shrink them).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcring import _deps
from hpcring.engine import ProcessSet, global_process_set
from hpcring.torch import basics
from hpcring.torch.collective_ops import allgather, broadcast_, broadcast_async_
from hpcring.torch.op_handles import synchronize


def _set_kw(process_set: Any) -> dict[str, Any]:
    """Pass `process_set` only when given, so the op surface's own default (the global set) applies."""
    return {} if process_set is None else {"process_set": process_set}


def _pickler() -> Any:
    """cloudpickle when installed (lambdas, local classes), else the standard pickle."""
    return _deps.require("cloudpickle") if _deps.available("cloudpickle") else pickle


def _to_bytes_tensor(obj: Any) -> Any:
    buf = io.BytesIO()
    _pickler().dump(obj, buf)
    return _deps.torch().frombuffer(bytearray(buf.getvalue()), dtype=_deps.torch().uint8)


def _from_bytes_tensor(t: Any) -> Any:
    return pickle.loads(t.numpy().tobytes())


def _named_tensors(params: Any) -> list[tuple[str | None, Any]]:
    """Normalise a state_dict, named_parameters() or parameters() to `(name, tensor)` pairs."""
    torch = _deps.torch()
    if isinstance(params, Mapping):
        items: list[Any] = sorted(params.items())
    elif (
        isinstance(params, Iterable) and not isinstance(params, (str, bytes)) and not torch.is_tensor(params)
    ):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(
            f"invalid params of type {type(params).__name__}: pass model.state_dict(), "
            "model.named_parameters() or model.parameters()"
        )
    for name, tensor in items:
        if not torch.is_tensor(tensor):
            raise ValueError(f"parameter {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    return items


def broadcast_parameters(params: Any, root_rank: int, process_set: Any = None) -> None:
    """Overwrite `params` in place with root_rank's values (all broadcasts in flight at once, then waited)."""
    handles = [
        broadcast_async_(tensor.detach(), root_rank, name=name, **_set_kw(process_set))
        for name, tensor in _named_tensors(params)
    ]
    for handle in handles:
        synchronize(handle)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet | None = global_process_set
) -> Any:
    """Return root_rank's `obj` on every rank (pickled; the value passed on other ranks is ignored).

    The default name does not depend on `obj`'s type (Horovod's does), so passing `None` on non-root ranks,
    the usual idiom, cannot make the ranks disagree on the collective's name.
    """
    torch = _deps.torch()
    name = name or "broadcast_object"
    is_root = basics.rank() == root_rank
    payload = _to_bytes_tensor(obj) if is_root else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    broadcast_(size, root_rank, name=f"{name}.sz", **_set_kw(process_set))
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.t", **_set_kw(process_set))
    return obj if is_root else _from_bytes_tensor(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Return the list of every rank's `obj`, in rank order (each pickled, sizes gathered first)."""
    torch = _deps.torch()
    name = name or "allgather_object"
    payload = _to_bytes_tensor(obj)
    sizes = allgather(
        torch.tensor([payload.numel()], dtype=torch.int64), name=f"{name}.sz", **_set_kw(process_set)
    )
    gathered = allgather(payload, name=f"{name}.t", **_set_kw(process_set))
    out, start = [], 0
    for n in sizes.tolist():
        out.append(_from_bytes_tensor(gathered[start : start + n]))
        start += n
    return out


@dataclass(frozen=True)
class _TensorRef:
    """Placeholder for a tensor inside the pickled optimizer state: where it goes and how to allocate it."""

    index: int
    shape: tuple[int, ...]
    dtype: Any
    cuda: bool


def _strip(value: Any, tensors: list[Any]) -> Any:
    """Copy of `value` with every tensor replaced by a `_TensorRef`; the tensors are appended to `tensors`."""
    torch = _deps.torch()
    if torch.is_tensor(value):
        tensors.append(value)
        return _TensorRef(len(tensors) - 1, tuple(value.shape), value.dtype, value.is_cuda)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_strip(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: list[Any]) -> Any:
    """Inverse of `_strip`: put the received tensors back where their references are."""
    if isinstance(value, _TensorRef):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def _allocate(ref: _TensorRef, gpu: Any) -> Any:
    """A receive buffer for one broadcast state tensor: on `gpu` when the root's was on a GPU."""
    torch = _deps.torch()
    return torch.empty(ref.shape, dtype=ref.dtype, device=gpu if ref.cuda else torch.device("cpu"))


def _state_gpu(optimizer: Any) -> Any:
    """The GPU this rank's state belongs on: its parameters' (a model moved with `.to(f"cuda:{local_rank}")`
    without `torch.cuda.set_device` still lives there), else the current device. Not simply the current
    device: that would be cuda:0 on every rank, and NCCL refuses several ranks on one GPU."""
    torch = _deps.torch()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_cuda:
                return p.device
    return torch.device("cuda", torch.cuda.current_device())


def broadcast_optimizer_state(
    optimizer: Any, root_rank: int, model: Any = None, *, process_set: Any = None
) -> None:
    """Make every rank's optimizer state (per-parameter state and param_groups options) equal root_rank's.

    Works for every `torch.optim` optimizer and for a `DistributedOptimizer`: tensors are broadcast as
    tensors (in place on the root), the rest of the state dict (scalars, `None`, tuples, learning rates) as
    one pickle. `model` is Horovod's third parameter; here it only names the sparse parameters (below).
    `process_set` is hpcring's, keyword-only.

    Horovod runs a zero-gradient step on a fresh optimizer to create its state, which changes the weights
    when weight decay is on; here weights and state stay as they are. What a script can see of that step is
    kept: a fresh optimizer's trainable parameters without a gradient get a zero one (sparse where Horovod
    makes it sparse), so code that reads `p.grad` right after this call works as under Horovod.
    """
    if not optimizer.state_dict()["state"]:
        _zero_missing_grads(optimizer, model)
    is_root = basics.rank() == root_rank
    tensors: list[Any] = []
    skeleton = _strip(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(
        skeleton, root_rank, name="broadcast_optimizer_state", process_set=process_set
    )
    if not is_root:
        refs: list[_TensorRef] = []
        _collect_refs(skeleton, refs)
        ordered = sorted(refs, key=lambda r: r.index)
        gpu = _state_gpu(optimizer) if any(r.cuda for r in ordered) else None
        tensors = [_allocate(ref, gpu) for ref in ordered]
    handles = [
        broadcast_async_(t, root_rank, name=f"broadcast_optimizer_state.{i}", **_set_kw(process_set))
        for i, t in enumerate(tensors)
    ]
    for handle in handles:
        synchronize(handle)
    if not is_root:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _zero_missing_grads(optimizer: Any, model: Any) -> None:
    """Zero `.grad` for trainable parameters that have none: sparse for SparseAdam, and for SGD on the
    parameters of `model`'s sparse embeddings (Horovod's choice, so a sparse backward can accumulate)."""
    torch = _deps.torch()
    sparse_ids: set[int] = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse_ids.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad or p.grad is not None:
                continue
            zero = torch.zeros_like(p, memory_format=torch.preserve_format)
            sparse = isinstance(optimizer, torch.optim.SparseAdam) or (
                isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids
            )
            p.grad = zero.to_sparse() if sparse else zero


def _collect_refs(value: Any, refs: list[_TensorRef]) -> None:
    if isinstance(value, _TensorRef):
        refs.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_refs(v, refs)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_refs(v, refs)
