"""op=Adasum on the device plane: Horovod's two GPU forms.

- **Process-group routes** (`cuda` over NCCL; `cpu+gloo`, CI's stand-in): Horovod's hierarchical Adasum.
  The batch is packed on the device (padded to a multiple of the node's rank count), summed inside the node
  by a reduce-scatter over the node's process group, each rank's shard copied to host memory and combined
  across the nodes by Adasum over MPI (the ranks with this local rank, one per node), its per-tensor dot
  products added up over the node's ranks too (each holds another shard of the same tensors), copied back,
  allgathered inside the node and divided by the node's rank count. On one node there is nothing to combine
  across: Horovod then averages (its docs say so), and so does this route.
- **The MPI route** (`cuda+mpi`, `cpu+mpi`): packed on the device, staged to host memory, reduced by the
  host plane's flat Adasum over every rank, copied back: what Horovod does for GPU tensors without NCCL.

A joined rank contributes zeros (neutral for Adasum and for the node's sum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcring.collective import kernels
from hpcring.collective.arrays import numpy_view
from hpcring.collective.ops import ReduceOp
from hpcring.engine.device_routes import scale_, torch_dtype
from hpcring.engine.host_adasum import reduce_adasum
from hpcring.errors import CollectiveError

if TYPE_CHECKING:
    from hpcring.engine.device_lanes import Lane
    from hpcring.engine.device_plane import SetPlane
    from hpcring.engine.responses import Response
    from hpcring.engine.timeline import Timeline


def adasum(
    plane: SetPlane,
    lane: Lane,
    batch: Sequence[Response],
    timeline: Timeline | None,
    pack: Any,
    unpack: Any,
) -> list[Any]:
    """One (fused) Adasum allreduce on `lane`; each request's output (None for a joined rank's entries).
    `pack(batch, counts, buf, fill)` and `unpack(batch, counts, buf)` are the device plane's."""
    topo = plane.topo
    sig = batch[0].sig
    dtype = torch_dtype(sig.dtype)
    counts = [math.prod(r.sig.shape) for r in batch]
    total = sum(counts)
    names = [r.sig.name for r in batch] if timeline is not None else []
    staged = plane.carrier == "mpi" or topo.size == 1
    local = 1 if staged else topo.local_size
    pad = (-total) % local
    buf = lane.buffer("fusion", dtype, total + pad)
    with plane.span(lane, timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
        pack(batch, counts, buf, 0)
    with plane.span(lane, timeline, names, "COLLECTIVE"):
        if staged:
            plane._count("staged")
            host = _to_host(lane, buf, "staging")
            reduce_adasum(topo, numpy_view(host), counts, sig)
            if host is not buf:
                buf.copy_(host, non_blocking=True)
        else:
            scale_(buf, sig.prescale)
            _hierarchical(plane, lane, buf, [*counts, pad])
            scale_(buf, sig.postscale / topo.local_size)
    with plane.span(lane, timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
        return list(unpack(batch, counts, buf))


def _to_host(lane: Lane, t: Any, slot: str) -> Any:
    """`t` itself on a CPU lane, else a (pinned) host copy of it, the copy complete."""
    if t.device.type == "cpu":
        return t
    host = lane.buffer(slot, t.dtype, t.numel(), host=True)
    host.copy_(t, non_blocking=True)
    lane.synchronize()  # MPI reads it next: this thread waits for the copy, the training stream does not
    return host


def _hierarchical(plane: SetPlane, lane: Lane, buf: Any, counts: list[int]) -> None:
    """buf (prescaled here) = the Adasum across nodes of each node's sum, Horovod's GPU form; `counts`
    includes the padding as a last entry."""
    topo = plane.topo
    sig_nodes = len(topo.node_sizes)
    if not topo.is_homogeneous or not kernels.is_power_of_two(sig_nodes):
        raise CollectiveError(
            f"op=Adasum on the {plane.device_type} process-group route needs equal nodes, a power-of-two "
            f"number of them; this set has nodes of {list(topo.node_sizes)} ranks"
        )
    L = topo.local_size
    if sig_nodes == 1:  # one node: the node's sum is all there is (Horovod averages here)
        if topo.size > 1:
            lane.group("world").allreduce(buf, ReduceOp.SUM)
        return
    if L > 1:
        group = lane.group("local")
        shard = lane.buffer("shard", buf.dtype, buf.numel() // L)
        group.reduce_scatter_equal(buf, shard, ReduceOp.SUM)
    else:
        shard = buf
    host = _to_host(lane, shard, "cross_staging")
    lo = topo.local_rank * shard.numel()
    bounds = np.concatenate(([0], np.cumsum(counts)))
    mine = np.clip(bounds[1:], lo, lo + shard.numel()) - np.clip(bounds[:-1], lo, lo + shard.numel())
    node = topo.transport("local")
    extra = (lambda v: node.allreduce(v, ReduceOp.SUM)) if L > 1 else None
    kernels.adasum_allreduce(topo, numpy_view(host), [int(c) for c in mine], group="cross", extra_sum=extra)
    if host is not shard:
        shard.copy_(host, non_blocking=True)
    if L > 1:
        group.allgather_equal(shard, buf)
