"""`DistributedOptimizer`: Horovod's gradient-averaging wrapper around any `torch.optim` optimizer.

A post-accumulate-grad hook on each parameter sees its gradient the moment autograd has accumulated it, so
communication overlaps the rest of the backward pass; `step()` waits for the reductions and then runs the
wrapped optimizer's own update. The first step reduces per tensor and learns the order in which gradients
become ready; from then on dense gradients live in flat buckets (`buckets.py`). When the set of trainable
parameters changes, the next step goes per tensor again and the buckets are rebuilt after it, on every rank.
As in Horovod the wrapper is a dynamic subclass of the optimizer's class, so `isinstance` checks and LR
schedulers keep working.

Differences from Horovod, each removing a way for ranks to hang or disagree (docs/guide/torch.md): a parameter
that got no gradient on this rank is reduced as zeros, a group only partly ready at `synchronize()` is
reduced as a whole, and the wrapped optimizer's state is kept (Horovod rebuilds the optimizer and drops it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from hpcring import _deps
from hpcring.engine import ProcessSet, global_process_set
from hpcring.torch import autotune, basics
from hpcring.torch import buckets as bucketing
from hpcring.torch.adasum_optimizer import adasum_optimizer
from hpcring.torch.allreduce_ops import allreduce_async_, grouped_allreduce_async_
from hpcring.torch.collective_ops import sparse_allreduce_async
from hpcring.torch.compression import Compression, Compressor
from hpcring.torch.functions import broadcast_object
from hpcring.torch.op_handles import Adasum, Average, Sum
from hpcring.torch.op_handles import synchronize as wait_for

_Key = Any  # a parameter tensor, or a tuple of them for a group


# Horovod's words for a gradient computed again after its reduction started (one pass too many before step()).
_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)


def _split_list(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Split into `parts` contiguous chunks whose lengths differ by at most one (Horovod's split_list)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return [chunk for chunk in out if chunk]


def _find_duplicates(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dups: set[str] = set()
    for name in names:
        (dups if name in seen else seen).add(name)
    return sorted(dups)


class _DistributedOptimizer:
    """Methods mixed in front of the wrapped optimizer's class; `super()` is that class."""

    # Set by `_setup`; declared for readers and type checkers.
    _compression: type[Compressor]
    _parameter_names: dict[Any, str]
    _allreduce_delay: dict[int, int]  # id(parameter) -> backward passes left before its reduction
    _requires_update: list[Any]
    _handles: dict[_Key, tuple[Any, Any]]
    _p_to_group: dict[Any, tuple[Any, ...]]
    _group_counts: dict[tuple[Any, ...], int]
    _hook_handles: list[Any]
    _buckets: list[bucketing.Bucket] | None  # None: this step reduces per tensor (learning the order)
    _slot: dict[int, tuple[bucketing.Bucket, Any]]  # id(bucketed parameter) -> (its bucket, its view)
    _loose: list[
        Any
    ]  # reduced parameters outside every bucket (sparse gradients; all before the first build)
    _order: dict[Any, None]  # parameters in the order their gradient became ready this step
    _sparse: set[int]  # ids of parameters seen with a sparse gradient: kept out of buckets
    param_groups: list[dict[str, Any]]

    def _setup(
        self,
        named_parameters: Any,
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: Any,
        gradient_predivide_factor: float,
        groups: Any,
        sparse_as_dense: bool,
        process_set: Any,
        bucket_cap_mb: float | None = None,
    ) -> None:
        """Validate the names, record the settings and register one hook per trainable parameter."""
        self._compression = compression
        self._parameter_names = self._validated_names(named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {id(p): backward_passes_per_step for p in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = global_process_set if process_set is None else process_set
        self._groups = groups
        self._handles = {}
        self._requires_update = []
        self._p_to_group = {}
        self._group_counts = {}
        self._hook_handles = []
        self._synchronized = False
        self._should_synchronize = True
        self._buckets = None
        self._slot = {}
        self._loose = []
        self._order = {}
        self._sparse = set()
        self._hooked = False  # a bucketed gradient was seen since the last synchronize (zero_grad guard)
        self._check_due = True  # the first hook of a step compares the trainable parameters with the layout
        self._generation = 0
        self._hooked_ids: set[int] = set()
        if bucket_cap_mb is None:
            bucket_cap_mb = basics.engine().settings.bucket_cap_mb if self._reduces() else 0.0
        if bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb must be >= 0 (0: one request per gradient), got {bucket_cap_mb}")
        self._bucket_cap = int(bucket_cap_mb * (1 << 20))
        self._reducing = self._reduces()  # also: HOROVOD_AUTOTUNE times the steps of optimizers that reduce
        if self._reducing:
            self._register_hooks()

    def _reduces(self) -> bool:
        """Whether this rank takes part in reductions: as Horovod, not at one rank (unless elastic), and not
        when it is outside the optimizer's process set (step() then applies the local gradient)."""
        basics.size()  # not initialized: Horovod's error, here rather than a silent local optimizer
        elastic = os.environ.get("HPCRING_ELASTIC", os.environ.get("HOROVOD_ELASTIC")) == "1"
        ps = self.process_set
        return bool(ps.included()) and ((ps.size() or 0) > 1 or elastic)

    def _validated_names(self, named_parameters: Any) -> dict[Any, str]:
        """Map each parameter to its allreduce name; Horovod's ValueErrors for bad or missing names."""
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            named = [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
        else:
            named = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError(
                "named_parameters should be a sequence of tuples (name, parameter), "
                "usually produced by model.named_parameters()."
            )
        dups = _find_duplicates(name for name, _ in named)
        if dups:
            raise ValueError(
                f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}"
            )
        named_ids = {id(p) for _, p in named}
        unnamed = [p for p in params if id(p) not in named_ids]
        if unnamed:
            raise ValueError(
                "named_parameters was specified, but one or more model parameters were not named "
                f"({len(unnamed)} unnamed, shapes {[tuple(p.shape) for p in unnamed]}). Pass every parameter "
                "the optimizer holds, e.g. model.named_parameters() of the model the optimizer was built on."
            )
        wanted = {id(p) for p in params}
        return {p: name for name, p in sorted(named, key=lambda item: item[0]) if id(p) in wanted}

    def _register_hooks(self) -> None:
        self._requires_update = self._trainable()
        self._loose = list(self._requires_update)
        if self._groups is not None:
            self._form_groups()
        for p in self._requires_update:
            self._hook(p)

    def _hook(self, p: Any) -> None:
        if id(p) not in self._hooked_ids:
            self._hooked_ids.add(id(p))
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _trainable(self) -> list[Any]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _check_layout(self) -> None:
        """At the first hook of a step (or at synchronize when none ran): when the trainable parameters
        differ from the ones the buckets were built for (frozen, unfrozen, added with add_param_group), drop
        the buckets: this step reduces per tensor and the buckets are rebuilt after it. Every rank of an SPMD
        script changes its parameters at the same step, so every rank rebuilds at the same step."""
        current = self._trainable()
        if list(map(id, current)) == list(map(id, self._requires_update)):
            return
        flat = [p for group in self.param_groups for p in group["params"]]
        for p in current:
            if p not in self._parameter_names:  # added with add_param_group: named by its position
                index = next(i for i, q in enumerate(flat) if q is p)
                self._parameter_names[p] = f"allreduce.added.{index}"
            self._allreduce_delay.setdefault(id(p), self.backward_passes_per_step)
            self._hook(p)
        self._requires_update = current
        self._loose = list(current)
        self._buckets, self._slot, self._order = None, {}, {}
        if self._groups is not None:
            self._p_to_group, self._group_counts = {}, {}
            self._form_groups()

    def _form_groups(self) -> None:
        """Build the fusion groups in rank 0's parameter order, so every rank forms identical groups."""
        names = [self._parameter_names[p] for p in self._requires_update]
        root = self.process_set.ranks[0] if self.process_set.ranks else 0
        order = broadcast_object(
            names, root_rank=root, name="DistributedOptimizer.groups", process_set=self.process_set
        )
        position = {name: i for i, name in enumerate(order)}
        ordered = sorted(
            self._requires_update, key=lambda p: position.get(self._parameter_names[p], len(order))
        )
        if isinstance(self._groups, list):
            wanted = {id(p) for p in ordered}
            p_groups = [[p for p in group if id(p) in wanted] for group in self._groups]
            grouped = {id(p) for group in p_groups for p in group}
            p_groups += [[p] for p in ordered if id(p) not in grouped]
        else:
            p_groups = _split_list(ordered, int(self._groups))
        for members in p_groups:
            if not members:
                continue
            group = tuple(members)
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated locally before gradients are reduced."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _scale_factors(self) -> tuple[float, float]:
        """Average splits its division between before and after the sum (gradient_predivide_factor)."""
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _set_kw(self) -> dict[str, Any]:
        return {"process_set": self.process_set}

    def _ensure_grad(self, p: Any) -> Any:
        """A parameter with no gradient on this rank still joins the reduction, with zeros."""
        if p.grad is None:
            p.grad = _deps.torch().zeros_like(p)
        return p.grad

    def _allreduce_grad_async(self, p: Any) -> tuple[Any, Any]:
        name = self._parameter_names.get(p)
        tensor = self._ensure_grad(p)
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return sparse_allreduce_async(tensor, name=name, op=self.op, **self._set_kw()), None
            tensor = tensor.to_dense()
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scale_factors()
        handle = allreduce_async_(
            compressed, name=name, op=self.op, prescale_factor=pre, postscale_factor=post, **self._set_kw()
        )
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group: tuple[Any, ...]) -> tuple[Any, Any]:
        grads = [self._ensure_grad(p) for p in group]
        grads = [g.to_dense() if g.is_sparse else g for g in grads]
        compressed, ctxs = zip(*[self._compression.compress(g) for g in grads], strict=True)
        pre, post = self._scale_factors()
        handle = grouped_allreduce_async_(
            list(compressed),
            name=self._parameter_names.get(group[0]),
            op=self.op,
            prescale_factor=pre,
            postscale_factor=post,
            **self._set_kw(),
        )
        return handle, ctxs

    def _make_hook(self, p: Any) -> Any:
        # Dicts on this path are keyed by id(p): a tensor's own __hash__ is a Python call, and a step runs
        # this hook once per gradient and backward pass.
        pid = id(p)

        def hook(*_: Any) -> None:
            if self._check_due:
                self._check_due = False
                self._check_layout()
            slot = self._slot.get(pid)
            if slot is None:
                self._tensor_hook(p)
            else:
                self._bucket_hook(p, pid, slot)

        return hook

    def _bucket_hook(self, p: Any, pid: int, slot: tuple[bucketing.Bucket, Any]) -> None:
        """A bucketed gradient is ready: make sure it lives in its view, count it, submit a full bucket."""
        delay = self._allreduce_delay
        left = delay[pid]
        if left <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        delay[pid] = left - 1
        self._hooked = True
        bucket, view = slot
        grad = p.grad
        if grad is not view:  # zero_grad(set_to_none=True) or the caller replaced it: one copy, as DDP
            view.copy_(grad)
            p.grad = view
        if left == 1:
            bucket.remaining -= 1
            if bucket.remaining == 0:
                self._submit_bucket(bucket)

    def _submit_bucket(self, bucket: bucketing.Bucket) -> None:
        """One in-place allreduce of the bucket (in the compressed dtype when compressing: a casting
        compressor casts into the bucket's persistent wire buffer, others allocate as they do)."""
        cast = self._compression.wire_dtype
        flat = bucket.flat
        if cast is not None and flat.dtype.is_floating_point:
            if bucket.wire is None:
                bucket.wire = _deps.torch().empty(flat.shape, dtype=getattr(_deps.torch(), cast))
            wire = bucket.wire
            wire.copy_(flat)
            self._submit_cast(bucket, wire)
            return
        wire, bucket.ctx = self._compression.compress(flat)
        pre, post = self._scale_factors()
        bucket.handle = allreduce_async_(
            wire, name=bucket.name, op=self.op, prescale_factor=pre, postscale_factor=post, **self._set_kw()
        )

    def _submit_cast(self, bucket: bucketing.Bucket, wire: Any) -> None:
        """A cast bucket is summed in its 16-bit dtype and Average's division is applied after the cast
        back, in the gradients' own dtype: one multiplication by torch instead of the engine's 16-bit
        scaling through float32 numpy copies, and one rounding less."""
        pre, post = self._scale_factors()
        factor = post / (self.process_set.size() or 1) if self.op == Average else post
        bucket.ctx = (_CAST, factor)
        bucket.handle = allreduce_async_(
            wire, name=bucket.name, op=Sum, prescale_factor=pre, **self._set_kw()
        )

    def _tensor_hook(self, p: Any) -> None:
        """The per-tensor path: every gradient of the learning step, and sparse gradients always."""
        if self._buckets is None:
            self._order[p] = None
            if p.grad is not None and p.grad.is_sparse:
                self._sparse.add(id(p))
        # Every pass beyond backward_passes_per_step before step(): a parameter whose reduction already
        # started (alone, or as a member of a group, whose entry has no handle of its own).
        pid = id(p)
        if self._allreduce_delay[pid] <= 0:
            raise AssertionError(_TOO_MANY_PASSES)
        self._allreduce_delay[pid] -= 1
        if self._allreduce_delay[pid] > 0:
            self._handles[p] = (None, None)
            return
        group = self._p_to_group.get(p) if self._buckets is None else None
        if group is None:
            self._handles[p] = self._allreduce_grad_async(p)
            return
        self._group_counts[group] += 1
        if self._group_counts[group] < len(group):
            self._handles[p] = (None, None)  # pending in a partial group: zero_grad() must refuse
            return
        for gp in group:
            self._handles.pop(gp, None)
        self._handles[group] = self._grouped_allreduce_grad_async(group)
        self._group_counts[group] = 0

    def _launch_missing(self) -> None:
        """Start every reduction the hooks did not: unused parameters, early step(), partial groups and
        buckets (a member without a gradient contributes zeros, so no rank waits for it)."""
        for bucket in self._buckets or ():
            if bucket.handle is None:
                bucket.bind()
                self._submit_bucket(bucket)
        launched = {id(p) for key, (h, _) in self._handles.items() if h is not None for p in _members(key)}
        for p in self._loose:
            if id(p) in launched:
                continue
            group = self._p_to_group.get(p) if self._buckets is None else None
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
                launched.add(id(p))
            else:
                for gp in group:
                    self._handles.pop(gp, None)
                self._handles[group] = self._grouped_allreduce_grad_async(group)
                self._group_counts[group] = 0
                launched.update(id(gp) for gp in group)

    def synchronize(self) -> None:
        """Wait for every gradient reduction and write the results into `p.grad` (e.g. to clip them)."""
        if not self._reducing:  # one rank (as Horovod: no hooks, nothing to reduce) or outside the set
            self._synchronized = True
            return
        if self._check_due:  # no hook ran this step
            self._check_due = False
            self._check_layout()
        self._launch_missing()
        for bucket in self._buckets or ():
            output = wait_for(bucket.handle)
            if type(bucket.ctx) is tuple and bucket.ctx[0] is _CAST:  # back into the gradients' dtype
                bucket.flat.copy_(output)
                if bucket.ctx[1] != 1.0:
                    bucket.flat.mul_(bucket.ctx[1])
            elif output is not bucket.flat:  # compressed
                bucket.flat.copy_(self._compression.decompress(output, bucket.ctx))
            bucket.reset()
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, pctx in zip(key, wait_for(handle), ctx, strict=True):
                    self._allreduce_delay[id(p)] = self.backward_passes_per_step
                    _write_grad(p, self._compression.decompress(output, pctx))
            else:
                output = handle() if callable(handle) else wait_for(handle)
                self._allreduce_delay[id(key)] = self.backward_passes_per_step
                _write_grad(key, self._compression.decompress(output, ctx) if ctx is not None else output)
        self._handles.clear()
        self._allreduce_delay.update(
            dict.fromkeys(map(id, self._requires_update), self.backward_passes_per_step)
        )
        self._hooked = False
        self._check_due = True
        self._synchronized = True
        if self._buckets is None and self._bucket_cap > 0:
            self._build_buckets()

    def _build_buckets(self) -> None:
        """Lay the dense gradients out in buckets, in the readiness order of the root of the process set (a
        collective over the set: every rank builds at the end of the same step, and gets the same buckets
        whatever order it saw its own gradients in)."""
        names = self._parameter_names
        dense = [p for p in self._requires_update if id(p) not in self._sparse]
        dense_ids = {id(p) for p in dense}
        seen = [p for p in self._order if id(p) in dense_ids]
        seen_ids = {id(p) for p in seen}
        order = seen + [p for p in reversed(dense) if id(p) not in seen_ids]  # never ready: DDP's order
        if self._groups is not None:
            position = {id(p): i for i, p in enumerate(order)}
            groups = [[p for p in g if id(p) in dense_ids] for g in self._group_counts]
            groups = [g for g in groups if g]
            groups.sort(key=lambda g: min(position[id(p)] for p in g))
            spec = bucketing.split_by_kind([[bucketing.describe(p, names[p]) for p in g] for g in groups])
        else:
            spec = bucketing.plan([bucketing.describe(p, names[p]) for p in order], self._bucket_cap)
        root = self.process_set.ranks[0] if self.process_set.ranks else 0
        self._generation += 1
        spec = broadcast_object(
            spec,
            root_rank=root,
            name=f"DistributedOptimizer.buckets.{self._generation}",
            process_set=self.process_set,
        )
        by_name = {names[p]: p for p in dense}
        missing = sorted({n for bucket in spec for n in bucket} - by_name.keys())
        if missing:
            raise ValueError(
                f"DistributedOptimizer: the root of the process set buckets gradients this rank does not "
                f"train ({', '.join(missing[:5])}); every rank must train the same parameters"
            )
        self._buckets = bucketing.allocate(spec, by_name, self._generation)
        self._slot = {id(p): (b, v) for b in self._buckets for p, v in zip(b.params, b.views, strict=True)}
        self._loose = [p for p in self._requires_update if id(p) not in self._slot]
        self._order = {}

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Make `step()` skip its own synchronize (after an explicit `synchronize()` and clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Wait for the averaged gradients, then apply the wrapped optimizer's update."""
        if self._reducing:
            autotune.on_step(self.process_set)  # HOROVOD_AUTOTUNE: a no-op when off or once it is done
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your "
                    "code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return cast(Any, super()).step(closure)

    # Torch wraps `step` of every optimizer class with its hook runner; the base class's step is already
    # wrapped, so marking ours stops the hooks from running twice.
    step.hooked = True  # type: ignore[attr-defined]

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Refuse while reductions are pending: zeroing would race with the engine writing the gradients."""
        if self._handles or self._hooked:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        cast(Any, super()).zero_grad(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Loading a checkpoint forgets pending reductions and restarts local accumulation."""
        self._handles = {}
        self._hooked = False
        for bucket in self._buckets or ():
            bucket.reset()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        cast(Any, super()).load_state_dict(*args, **kwargs)


_CAST = object()  # a bucket's ctx when it was cast into its wire buffer


def _members(key: _Key) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def _write_grad(p: Any, value: Any) -> None:
    """Store the reduced gradient; sparse gradients cannot `set_`, so they are rebuilt by adding."""
    if p.grad.is_sparse:
        reduced = value if value.is_sparse else value.to_sparse()
        p.grad.zero_().add_(reduced)
    elif value is not p.grad:
        p.grad.set_(value)


def _validate_groups(groups: Any) -> None:
    torch = _deps.torch()
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    elif isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")


def wrap_as(mixin: type, optimizer: Any) -> Any:
    """`optimizer` re-classed as `mixin` over its own class (Horovod's trick: isinstance still holds), with
    its state and without its bound `step`; the caller runs `_setup`."""
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"__module__": mixin.__module__})
    wrapped = cast(Any, object.__new__(cls))
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    return wrapped


def DistributedOptimizer(
    optimizer: Any,
    named_parameters: Any = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    bucket_cap_mb: float | None = None,
) -> Any:
    """Wrap `optimizer` so that `step()` applies gradients averaged (by `op`) over all ranks.

    Arguments follow `horovod.torch.DistributedOptimizer`: `named_parameters` names the reductions
    (usually `model.named_parameters()`); `compression` is a `Compression` member; `backward_passes_per_step`
    local passes are accumulated before reducing; `gradient_predivide_factor` splits Average's division
    around the sum; `groups` (an int, or lists of parameters) fuses gradients into grouped allreduces
    (`num_groups` is its deprecated alias); `sparse_as_dense` reduces sparse gradients densely; `process_set`
    limits the ranks (default `global_process_set`, every rank, as Horovod's; None means the same).
    `bucket_cap_mb` (hpcring's, not Horovod's; default `HPCRING_BUCKET_CAP_MB`, 25) caps the gradient
    buckets reduced as one request each; 0 reduces every gradient as its own request.
    """
    op = Average if op is None else op
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op is Adasum and basics.size() > 1:  # Horovod's delta optimizer; one rank keeps the plain wrapper
        return adasum_optimizer(
            optimizer, named_parameters, compression, backward_passes_per_step, process_set
        )
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning, stacklevel=2
        )
        groups = num_groups if groups is None else groups
    if groups is not None:
        _validate_groups(groups)
    wrapped = wrap_as(_DistributedOptimizer, optimizer)
    wrapped._setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
        bucket_cap_mb,
    )
    return wrapped
