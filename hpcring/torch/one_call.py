"""hpcring.torch's common case in one call each way: submit and synchronize through the compiled core.

`SUBMITTER` is the core's `Submitter` (hpcring/engine/core/src/submit.c) configured with this package's
objects, or None on the pure-Python path. Its `allreduce` takes what a training loop's gradients and metrics
are (a dense, contiguous CPU tensor of a plain dtype, a name, a reduce op other than Adasum, float factors,
a registered set) and answers NotImplemented for anything else, before it has changed anything: the Python
path in allreduce_ops.py then runs, and words every error. Its `synchronize` becomes op_handles.synchronize's
for int handles: it waits with the GIL released.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from hpcring import _deps
from hpcring.engine import OpType, ProcessSet, Signature, core, global_process_set
from hpcring.engine.caller_cycles import _defer, _deferring
from hpcring.torch import basics, op_handles
from hpcring.torch.op_handles import _OP_NAMES, ADASUM, Average, _after_device, _handle_map, _tls
from hpcring.torch.tensors import PLAIN_DTYPES

_deps.torch()  # a missing torch becomes BackendUnavailable naming the install command
import torch  # noqa: E402


def _host_dtypes() -> dict[Any, tuple[str, int, int]]:
    """torch dtype -> (name, numpy type number, item size) for the dtypes the core takes directly: the plain
    ones (no bool or bfloat16, which numpy does not view as torch stores them; no complex, which hpcring
    refuses)."""
    return {t: (name, np.dtype(name).num, np.dtype(name).itemsize) for t, name in PLAIN_DTYPES.items()}


def build_submitter(use_reader: bool = True) -> Any:
    """The core's Submitter over this package's objects (None on the pure-Python path); `use_reader=False`
    reads tensors through torch's Python attributes even where the torch reader loads (the tests)."""
    return core.submitter(
        use_reader=use_reader,
        basics=basics,
        tls=_tls,
        defer=_defer,
        deferring=_deferring,
        handle_map=_handle_map,
        handle_ids=op_handles._handle_ids,
        op_names=_OP_NAMES,
        average_op=Average,
        adasum_name=ADASUM,
        tensor_type=torch.Tensor,
        strided=torch.strided,
        set_type=ProcessSet,
        dtypes=_host_dtypes(),
        sig_type=Signature,
        allreduce=OpType.ALLREDUCE,
        after_device=_after_device,
        noname=op_handles._noname,
    )


SUBMITTER: Any = build_submitter()
if SUBMITTER is not None:  # every synchronize of an int handle (the public one, wait_now's) waits in C
    op_handles._core_synchronize = SUBMITTER.synchronize
    op_handles._core_group = SUBMITTER.group

_F = TypeVar("_F", bound=Callable[..., Any])


def entered_in_c(fn: _F) -> _F:
    """`fn`, an in-place allreduce_async_ with Horovod's signature, entered in C (`_core.Entry`,
    src/entry.c): the core reads the call's arguments, takes the common case, and calls `fn` with the same
    arguments for anything else. The Python frame of a function that only forwards to the core cost about a
    third of the submit. `fn` itself on the pure-Python path."""
    if SUBMITTER is None:
        return fn
    entry = core.entry(SUBMITTER, fn, global_process_set)
    functools.update_wrapper(entry, fn)  # name, docstring, __wrapped__ (inspect.signature follows it)
    return cast(_F, entry)


__all__ = ["SUBMITTER", "entered_in_c"]
