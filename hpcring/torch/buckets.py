"""Gradient buckets: how `DistributedOptimizer` reduces a step's dense gradients a bucket at a time.

The reduced parameters' gradients are views of a few flat buffers (PyTorch DDP's `gradient_as_bucket_view`):
`p.grad` *is* a slice of a bucket, so backward accumulates gradients where they are reduced and nothing is
copied in or out. A gradient hook only counts readiness; a bucket whose last gradient is ready goes to the
engine as one in-place allreduce (one request, one name), instead of one request per tensor.

Buckets follow the order in which gradients became ready in the first step (learned on the process set's
root and broadcast, so every rank forms the same buckets even when its own order differs), filled up to
`bucket_cap_mb` (`HPCRING_BUCKET_CAP_MB`, DDP's 25 MiB default). Unlike DDP there is no smaller first bucket:
it buys overlap only where a core is idle during backward and costs a negotiation per step
(docs/dev/engine.md, "DistributedOptimizer"). Buckets of one dtype and device share one allocation in bucket
order, so buckets the engine fuses in one cycle are adjacent in memory and reduced where they lie (the
engine's zero-copy path). With `groups`, each group is a bucket (split by dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcring import _deps

# One parameter as the root describes it: (name, bytes, dtype, device).
ParamInfo = tuple[str, int, str, str]


class Bucket:
    """A flat gradient buffer, the parameters whose `.grad` are views of it, and this step's state."""

    __slots__ = ("ctx", "flat", "handle", "name", "params", "remaining", "views", "wire")

    def __init__(self, name: str, params: list[Any], flat: Any) -> None:
        self.name = name
        self.params = params
        self.flat = flat
        self.views: list[Any] = []
        offset = 0
        for p in params:
            n = p.numel()
            self.views.append(flat[offset : offset + n].view_as(p))
            offset += n
        self.remaining = len(params)  # members whose gradient is not ready yet this step
        self.handle: Any = None  # the engine handle while the bucket is in flight
        self.ctx: Any = None  # the compressor's context for the wire tensor
        self.wire: Any = None  # persistent buffer of a casting compressor's dtype (built on first use)

    def bind(self) -> None:
        """Make every member's `.grad` its view (copying a gradient that lives elsewhere; None -> zeros): a
        member whose gradient was reset to None, never computed, or replaced by the caller."""
        for p, view in zip(self.params, self.views, strict=True):
            grad = p.grad
            if grad is view:
                continue
            if grad is None:
                view.zero_()
            else:
                view.copy_(grad)
            p.grad = view

    def reset(self) -> None:
        self.remaining = len(self.params)
        self.handle = None
        self.ctx = None


def plan(infos: Sequence[ParamInfo], cap_bytes: int) -> list[list[str]]:
    """Buckets of parameter names, in `infos` order (readiness order), one dtype and device per bucket, up to
    `cap_bytes` each. A parameter larger than the cap gets a bucket of its own."""
    open_: dict[tuple[str, str], tuple[list[str], int]] = {}
    done: list[list[str]] = []
    for name, nbytes, dtype, device in infos:
        key = (dtype, device)
        names, used = open_.get(key, ([], 0))
        if names and used + nbytes > cap_bytes:
            done.append(names)
            names, used = [], 0
        names.append(name)
        open_[key] = (names, used + nbytes)
    done.extend(names for names, _ in open_.values() if names)
    return done


def split_by_kind(groups: Sequence[Sequence[ParamInfo]]) -> list[list[str]]:
    """Explicit groups as buckets: each group keeps its members together, split only where dtypes or
    devices differ (a bucket is one flat buffer)."""
    out: list[list[str]] = []
    for group in groups:
        kinds: dict[tuple[str, str], list[str]] = {}
        for name, _, dtype, device in group:
            kinds.setdefault((dtype, device), []).append(name)
        out.extend(kinds.values())
    return out


def allocate(spec: Sequence[Sequence[str]], by_name: dict[str, Any], generation: int) -> list[Bucket]:
    """Buckets for `spec` (names, agreed across ranks). Buckets of one dtype and device are consecutive
    slices of one allocation, in spec order. Every member's current gradient (if any) is copied into its
    view and `.grad` rebound to it. KeyError-free: the caller checked every name exists."""
    torch = _deps.torch()
    members = [[by_name[n] for n in names] for names in spec]
    totals: dict[tuple[Any, Any], int] = {}
    for params in members:
        key = (params[0].dtype, params[0].device)
        totals[key] = totals.get(key, 0) + sum(p.numel() for p in params)
    storage = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in totals.items()}
    offsets = dict.fromkeys(totals, 0)
    buckets = []
    for i, params in enumerate(members):
        key = (params[0].dtype, params[0].device)
        n = sum(p.numel() for p in params)
        flat = storage[key][offsets[key] : offsets[key] + n]
        offsets[key] += n
        bucket = Bucket(f"DistributedOptimizer.bucket.{generation}.{i}", params, flat)
        for p, view in zip(params, bucket.views, strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
                p.grad = view
        buckets.append(bucket)
    return buckets


def describe(p: Any, name: str) -> ParamInfo:
    """(name, bytes, dtype, device) of a parameter, as the bucket plan needs it."""
    return (name, p.numel() * p.element_size(), str(p.dtype).removeprefix("torch."), str(p.device))
