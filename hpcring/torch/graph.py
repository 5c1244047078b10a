"""When a collective builds an autograd graph: only where a gradient can flow.

Each differentiable op of `hpcring.torch` is a `torch.autograd.Function`, as in Horovod. Its `apply` has a
fixed cost per call (a context, bookkeeping of inputs and outputs) whether or not anything will be
differentiated, and most calls differentiate nothing: a metric or a loss being averaged, parameters being
broadcast. There `run_op` runs the Function's forward alone, with a throwaway context; for such inputs
`apply` gives the same tensors, with no graph either (docs/dev/engine.md, "Out-of-place allreduce", has the
figures)."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from hpcring import _deps

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402


class _NoGraph:
    """The context a forward gets when no graph is built: it keeps what forward stores (nobody reads it)
    and ignores its marks."""

    def mark_non_differentiable(self, *_: Any) -> None:
        pass

    def save_for_backward(self, *_: Any) -> None:
        pass


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def run_op(function: Any, inputs: Iterable[Any], *args: Any) -> Any:
    """`function.apply(*args)` where a gradient can flow into one of `inputs` (grad mode on and an input
    that requires one); otherwise `function.forward` alone."""
    if torch.is_grad_enabled():
        try:
            needed = any(map(_REQUIRES_GRAD, inputs))  # a C-level pass: this runs on every synchronous op
        except AttributeError:  # not a tensor: the op itself refuses it, in its own words
            needed = False
        if needed:
            return function.apply(*args)
    return function.forward(_NoGraph(), *args)
