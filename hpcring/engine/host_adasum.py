"""op=Adasum on the host plane: a fused batch packed whole and reduced by the collective floor's Adasum.

Adasum is not element-wise, so none of the sum's shortcuts apply (shared memory, reducing adjacent views where
they lie, the one-rank copy): the batch's tensors go back to back into the fusion buffer (a lone tensor is
reduced in its output) and the algorithm gets each tensor's element count, so every tensor keeps its own dot
products and norms. A joined rank contributes zeros, which Adasum leaves out (a zero vector's coefficient
is 1 and it adds nothing). Horovod's CPU Adasum runs over every rank of the job, flat, whatever the nodes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpcring.collective import dtypes, kernels
from hpcring.collective.topology import Topology
from hpcring.engine.host_buffers import _unpack
from hpcring.engine.request import Signature
from hpcring.engine.responses import Response, numpy_dtype
from hpcring.engine.set_state import SetState
from hpcring.engine.timeline import Timeline, span
from hpcring.errors import CollectiveError

NDArray = np.ndarray[Any, Any]

ADASUM = "adasum"  # the agreed signature's reduce_op


def reduce_adasum(topo: Topology, buf: NDArray, counts: list[int], sig: Signature) -> None:
    """buf (1-D) = prescale, Adasum over every rank of `topo`, postscale. Refused (the same error on every
    rank: the size is agreed) unless the set holds a power of two ranks."""
    if not kernels.is_power_of_two(topo.size):
        raise CollectiveError(
            f"allreduce of {sig.name!r}: op=Adasum needs a power-of-two number of ranks, this set has "
            f"{topo.size}; allowed: {kernels.adasum_sizes(topo.size)}"
        )
    if sig.prescale != 1.0:
        dtypes.scale(buf, sig.prescale)
    kernels.adasum_allreduce(topo, buf, counts)
    if sig.postscale != 1.0:
        dtypes.scale(buf, sig.postscale)


def adasum_batch(st: SetState, batch: list[Response], timeline: Timeline | None) -> list[Any]:
    """One (fused) Adasum allreduce; each request's output (None for a joined rank's entries)."""
    sig = batch[0].sig
    dtype = numpy_dtype(sig.dtype)
    counts = [math.prod(r.sig.shape) for r in batch]
    names = [r.sig.name for r in batch] if timeline is not None else []
    reqs = [r.local for r in batch]
    lone = reqs[0] if len(batch) == 1 else None
    if lone is not None and lone.tensor is not None:  # reduced in its own output
        out = lone.output if lone.output is not None else lone.tensor
        flat = out.reshape(-1)
        if out is not lone.tensor:
            flat[...] = lone.tensor.reshape(-1)
        with span(timeline, names, "COLLECTIVE"):
            reduce_adasum(st.topology, flat, counts, sig)
        return [out]
    buf = st.fusion_view(dtype, sum(counts))
    with span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
        off = 0
        for req, n in zip(reqs, counts, strict=True):
            part = buf[off : off + n]
            if req is None or req.tensor is None:
                part[...] = 0
            else:
                part[...] = req.tensor.reshape(-1)
            off += n
    with span(timeline, names, "COLLECTIVE"):
        reduce_adasum(st.topology, buf, counts, sig)
    outputs: list[Any] = [
        None if q is None else (q.output if q.output is not None else q.tensor) for q in reqs
    ]
    with span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
        present = [i for i, o in enumerate(outputs) if o is not None]
        if len(present) == len(outputs):
            _unpack(buf, counts, outputs)
        else:
            bounds = np.cumsum([0, *counts])
            for i in present:
                out = outputs[i]
                out[...] = buf[bounds[i] : bounds[i + 1]].reshape(out.shape)
    return outputs
