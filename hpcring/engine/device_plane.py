"""The engine's device data plane: agreed batches of torch tensors that live on a device (`device_routes.py`),
moved on communication streams of their own (`device_lanes.py`).

Per process set and route a `SetPlane` holds the lanes; a batch runs on one of them, in the agreed order:

- **allreduce** over a process group (the `cuda` route, gloo in CI): fused tensors are packed with one
  `torch.cat(out=)` into the lane's fusion buffer, prescaled, reduced, postscaled (Average = Sum then
  postscale/size, integers truncated, exactly as the host path) and copied out with one
  `torch._foreach_copy_`; a lone tensor is reduced in its own output. Flat over the set's world group, or
  **hierarchical** when the set spans several nodes (the host path's `auto` rule, or forced with
  `HPCRING_ALLREDUCE_ALGORITHM=hierarchical`, also with one rank per node): reduce-scatter inside the node,
  allreduce of this rank's shard across nodes (MPI from pinned host memory by default,
  `HPCRING_DEVICE_CROSS=nccl` for the process group), allgather inside the node. Process groups are built
  the first time a batch needs them: a set of one rank, or a hierarchical route with one rank per node, never
  builds a world group.
- **the MPI route** (`cuda+mpi`, Horovod's `HOROVOD_GPU_OPERATIONS=MPI`): the batch is packed on the device,
  copied to pinned host memory on the lane, reduced by the host plane's own algorithms over MPI (shared
  memory inside a node included) and copied back on the lane. The same route carries every other op of a
  set whose hierarchical route crosses nodes over MPI.
- **allgather, broadcast, alltoall, reducescatter**: one process-group call each (row counts and splits are
  exchanged as small MPI messages), or staged over MPI as above.

Joined ranks contribute the neutral value (0, or the dtype's extreme for Min/Max, 1 for Product).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcring import _deps
from hpcring.collective import kernels
from hpcring.collective.arrays import numpy_view, to_kind
from hpcring.collective.kernels import HIERARCHICAL_MIN_BYTES, TorchTransport, part_sizes
from hpcring.collective.ops import BY_VALUE as REDUCE_OPS
from hpcring.collective.ops import ReduceOp
from hpcring.collective.stages import (
    CROSS_ALLREDUCE,
    INTRA_ALLGATHER,
    INTRA_REDUCE_SCATTER,
    StageHook,
    unobserved,
)
from hpcring.config import EngineSettings
from hpcring.engine.device_adasum import adasum
from hpcring.engine.device_lanes import Lane
from hpcring.engine.device_routes import (
    ROUTES,
    average_,
    neutral,
    rank_device,
    route_of,
    scale_,
    tensors,
    torch_dtype,
)
from hpcring.engine.engine_state import EngineState
from hpcring.engine.host_adasum import ADASUM
from hpcring.engine.host_plane import HostPlane, run_single
from hpcring.engine.request import OpType, Signature
from hpcring.engine.timeline import NULL_SPAN, stage_hook
from hpcring.errors import CollectiveError

if TYPE_CHECKING:
    from hpcring.collective.topology import Topology
    from hpcring.engine.responses import Response
    from hpcring.engine.timeline import Timeline

__all__ = ["ROUTES", "DevicePlane", "SetPlane", "hierarchical_allreduce"]


def hierarchical_allreduce(
    local: TorchTransport, buf: Any, shard: Any, op: ReduceOp, cross: Any, stages: StageHook = unobserved
) -> None:
    """In-place allreduce of the 1-D `buf` (length a multiple of the node's rank count) in three stages:
    reduce-scatter inside the node into `shard` (this local rank's 1/L of buf), `cross(shard)` (allreduce of
    the shard among the ranks with this local rank on the other nodes), allgather of the shards back into
    `buf` inside the node. `stages` hears each stage begin and end."""
    stages(INTRA_REDUCE_SCATTER, True)
    local.reduce_scatter_equal(buf, shard, op)
    _settle(buf, stages)
    stages(INTRA_REDUCE_SCATTER, False)
    stages(CROSS_ALLREDUCE, True)
    cross(shard)
    _settle(buf, stages)
    stages(CROSS_ALLREDUCE, False)
    stages(INTRA_ALLGATHER, True)
    local.allgather_equal(shard, buf)
    _settle(buf, stages)
    stages(INTRA_ALLGATHER, False)


def _settle(t: Any, stages: StageHook) -> None:
    """While someone measures the stages of a CUDA collective, wait for the GPU so a stage's span ends when
    its work does, not when it was queued; otherwise nothing (the stream keeps the stages in order)."""
    if t.is_cuda and stages is not unobserved:
        _deps.torch().cuda.current_stream(t.device).synchronize()


class SetPlane:
    """The device plane of one process set and route: its lanes, and what a batch does on one."""

    def __init__(
        self,
        topo: Topology,
        route: str,
        settings: EngineSettings,
        stats: dict[str, int],
        host: HostPlane,
    ) -> None:
        self.topo, self.settings, self.stats = topo, settings, stats
        self._host = host
        self.device_type, self.carrier = route_of(route)
        self.device = rank_device(self.device_type, topo)
        count = max(1, settings.num_streams)
        timeout = settings.collective_timeout_s  # torch.distributed's own watchdog bounds the GPU's work
        self.lanes = [Lane(self.device, self.carrier, topo, stats, timeout) for _ in range(count)]
        self._turn = 0
        # "NCCL inside a node, MPI between nodes" for the ops that have no three-stage form.
        nodes = len(topo.node_sizes)
        self._mpi_across = (
            nodes > 1 and settings.allreduce_algorithm == "hierarchical" and settings.device_cross == "mpi"
        )

    # -- lifecycle

    def next_lane(self) -> Lane:
        """The lane of the next batch: round-robin in the agreed order, the same on every rank."""
        lane = self.lanes[self._turn % len(self.lanes)]
        self._turn += 1
        return lane

    def on_device(self) -> contextlib.AbstractContextManager[Any]:
        """Make this rank's CUDA device current on the calling thread (which would otherwise use cuda:0)."""
        if self.device_type == "cuda":
            cm: contextlib.AbstractContextManager[Any] = _deps.torch().cuda.device(self.device)
            return cm
        return contextlib.nullcontext()

    def close(self) -> None:
        """Shut every lane's process groups down (on set removal and engine shutdown)."""
        for lane in self.lanes:
            lane.close()

    def span(self, lane: Lane, timeline: Timeline | None, names: list[str], phase: str) -> Any:
        """A timeline span over the batch's tensors; on CUDA it closes once the lane has run the work queued
        inside it (so spans show device time)."""
        if timeline is None:
            return NULL_SPAN
        return self._timed(lane, timeline, names, phase)

    @contextlib.contextmanager
    def _timed(self, lane: Lane, timeline: Timeline, names: list[str], phase: str) -> Iterator[None]:
        with timeline.span(names, phase):
            yield
            lane.synchronize()

    def _count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    # -- dispatch

    def dispatch(self, lane: Lane, batch: Sequence[Response], timeline: Timeline | None) -> list[Any]:
        """One agreed batch on `lane` (its stream is current); one result per response."""
        first = batch[0]
        op = first.sig.op_type
        staged = self.topo.size > 1 and self.carrier == "mpi"  # one rank: no data to move, only scaling
        if op is OpType.ALLREDUCE:
            if first.sig.reduce_op == ADASUM:  # not element-wise: Horovod's own forms (device_adasum.py)
                return adasum(self, lane, batch, timeline, _pack, _unpack)
            if staged:
                return self._staged_allreduce(lane, batch, timeline)
            return self.allreduce(lane, batch, timeline)
        names = [first.sig.name] if timeline is not None else []
        if op not in _SINGLE:
            raise CollectiveError(f"{op.value} has no device data plane (device {first.sig.device!r})")
        if staged or self._mpi_across:
            return [self._staged_single(lane, first, timeline, names)]
        with self.span(lane, timeline, names, "COLLECTIVE"):
            return [getattr(self, _SINGLE[op])(lane, first)]

    # -- allreduce over process groups

    def hierarchical(self, nbytes: int) -> bool:
        """Run the node-aware allreduce? The same answer on every rank (agreed size, agreed layout)."""
        t = self.topo
        if len(t.node_sizes) == 1 or not t.is_homogeneous:
            return False
        algorithm = self.settings.allreduce_algorithm
        if algorithm == "hierarchical":
            return True
        return algorithm == "auto" and t.local_size > 1 and nbytes >= HIERARCHICAL_MIN_BYTES

    def allreduce(self, lane: Lane, batch: Sequence[Response], timeline: Timeline | None) -> list[Any]:
        """One (fused) allreduce; returns each request's output (None for a joined rank's entries)."""
        sig = batch[0].sig
        dtype = torch_dtype(sig.dtype)
        counts = [math.prod(r.sig.shape) for r in batch]
        total = sum(counts)
        hier = self.topo.size > 1 and self.hierarchical(total * dtype.itemsize)
        if hier:
            self._count("hierarchical")
        local = self.topo.local_size if hier else 1
        pad = (-total) % local
        names = [r.sig.name for r in batch] if timeline is not None else []
        stages = stage_hook(timeline, names)
        src, out = tensors(batch[0])
        if len(batch) == 1 and src is not None and pad == 0:  # a lone tensor: reduced in its own output
            with self.span(lane, timeline, names, "COLLECTIVE"):
                flat = out.view(-1)
                if out is not src:
                    flat.copy_(src.view(-1))
                self._reduce(lane, flat, sig, hier, stages)
            return [out]
        buf = lane.buffer("fusion", dtype, total + pad)
        with self.span(lane, timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            _pack(batch, counts, buf, neutral(sig.reduce_op, dtype))
        with self.span(lane, timeline, names, "COLLECTIVE"):
            self._reduce(lane, buf, sig, hier, stages)
        with self.span(lane, timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            return _unpack(batch, counts, buf)

    def _reduce(self, lane: Lane, buf: Any, sig: Signature, hier: bool, stages: StageHook) -> None:
        """buf (1-D, on the device) = allreduce over the set, with the agreed op and scale factors."""
        op = REDUCE_OPS[sig.reduce_op]
        wire = op.base
        scale_(buf, sig.prescale)
        if self.topo.size > 1:
            if not hier:
                lane.group("world").allreduce(buf, wire)
            elif self.topo.local_size == 1:  # one rank per node: the cross-node stage is all there is
                stages(CROSS_ALLREDUCE, True)
                self._cross_allreduce(lane, buf, wire)
                _settle(buf, stages)
                stages(CROSS_ALLREDUCE, False)
            else:
                local = lane.group("local")
                shard = lane.buffer("shard", buf.dtype, buf.numel() // local.size)
                cross = lambda s: self._cross_allreduce(lane, s, wire)  # noqa: E731
                hierarchical_allreduce(local, buf, shard, wire, cross, stages)
        scale_(buf, sig.postscale / self.topo.size if op is ReduceOp.AVERAGE else sig.postscale)

    def _cross_allreduce(self, lane: Lane, shard: Any, op: ReduceOp) -> None:
        """The cross-node stage: MPI from (pinned) host memory, or the cross process group."""
        if len(self.topo.node_sizes) == 1:
            return
        self._count(f"cross_{self.settings.device_cross}")
        if self.settings.device_cross == "nccl":
            lane.group("cross").allreduce(shard, op)
            return
        host = shard
        if shard.device.type != "cpu":
            host = lane.buffer("cross_staging", shard.dtype, shard.numel(), host=True)
            host.copy_(shard, non_blocking=True)
            lane.synchronize()  # this thread waits for the copy; the training stream does not
        kernels.flat_allreduce(self.topo.transport("cross"), numpy_view(host), op)
        if host is not shard:
            shard.copy_(host, non_blocking=True)  # on the lane: ordered before the next staging copy

    # -- the MPI route: staged through host memory

    def _stage_out(self, lane: Lane, packed: Any, slot: str) -> Any:
        """`packed` (1-D, on the device) copied to this lane's host buffer `slot`, the copy complete."""
        host = lane.buffer(slot, packed.dtype, packed.numel(), host=True)
        host.copy_(packed, non_blocking=True)
        lane.synchronize()  # MPI reads it next: this thread waits for the copy, the training stream does not
        return host

    def _staged_allreduce(
        self, lane: Lane, batch: Sequence[Response], timeline: Timeline | None
    ) -> list[Any]:
        """A (fused) allreduce through host memory, reduced by the host plane over MPI."""
        self._count("staged")
        sig = batch[0].sig
        dtype = torch_dtype(sig.dtype)
        counts = [math.prod(r.sig.shape) for r in batch]
        total = sum(counts)
        names = [r.sig.name for r in batch] if timeline is not None else []
        src, out = tensors(batch[0])
        lone = len(batch) == 1 and src is not None
        with self.span(lane, timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            packed = src.reshape(-1) if lone else lane.buffer("fusion", dtype, total)
            if not lone:
                _pack(batch, counts, packed, neutral(sig.reduce_op, dtype))
            host = self._stage_out(lane, packed, "staging")
        with self.span(lane, timeline, names, "COLLECTIVE"):
            arr = numpy_view(host)
            if self._host.reduce(self.topo, arr, arr, sig, timeline, names) == "hierarchical":
                self._count("hierarchical")
        with self.span(lane, timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            if lone:
                out.view(-1).copy_(host, non_blocking=True)
                return [out]
            if self.device_type == "cpu":
                return _unpack(batch, counts, host)
            packed.copy_(host, non_blocking=True)
            return _unpack(batch, counts, packed)

    def _staged_single(self, lane: Lane, r: Response, timeline: Timeline | None, names: list[str]) -> Any:
        """allgather, broadcast, alltoall or reducescatter through host memory over MPI, with the host
        plane's own arithmetic; results back on the device, on the lane."""
        self._count("staged")
        sig, (src, out) = r.sig, tensors(r)
        assert r.local is not None and src is not None  # joined ranks are refused in negotiation
        with self.span(lane, timeline, names, "COLLECTIVE"):
            given = out if sig.op_type is OpType.BROADCAST else src
            host = self._stage_out(lane, given.reshape(-1), "staging")
            arr = numpy_view(host).reshape(given.shape)
            result = run_single(self.topo, sig, arr, arr, r.local.splits)
            if sig.op_type is OpType.BROADCAST:
                out.view(-1).copy_(host, non_blocking=True)
                return out
            if sig.op_type is OpType.ALLTOALL:
                rows, received = result
                return _on_device(rows, self.device), received
            return _on_device(result, self.device)

    # -- the other operations over process groups (one call each)

    def allgather(self, lane: Lane, r: Response) -> Any:
        sig, (src, _) = r.sig, tensors(r)
        assert src is not None  # joined ranks are refused in negotiation
        trailing = tuple(sig.shape[1:])
        torch = _deps.torch()
        out_rows = src.shape[0]
        if self.topo.size == 1:
            return src.clone()
        world = lane.group("world")
        rows: list[int] = world.allgather_object(int(out_rows))
        row = math.prod(trailing)
        out = torch.empty((sum(rows), *trailing), dtype=torch_dtype(sig.dtype), device=self.device)
        world.allgatherv(out, [n * row for n in rows], sendbuf=src)
        return out

    def broadcast(self, lane: Lane, r: Response) -> Any:
        sig, (_, buf) = r.sig, tensors(r)
        assert buf is not None  # joined ranks are refused in negotiation
        if self.topo.size > 1:
            lane.group("world").bcast(buf.view(-1), sig.root)
        return buf

    def alltoall(self, lane: Lane, r: Response) -> tuple[Any, np.ndarray[Any, Any]]:
        req, (src, _) = r.local, tensors(r)
        assert req is not None and src is not None  # joined ranks are refused in negotiation
        n = self.topo.size
        rows = int(src.shape[0])
        send = [int(v) for v in req.splits] if req.splits is not None else [rows // n] * n
        if n == 1:
            return src.clone(), np.asarray(send, dtype=np.int32)
        world = lane.group("world")
        recv: list[int] = world.comm.alltoall(send)
        row = math.prod(src.shape[1:])
        out = _deps.torch().empty((sum(recv), *src.shape[1:]), dtype=src.dtype, device=src.device)
        world.alltoallv(src, [k * row for k in send], out, [k * row for k in recv])
        return out, np.asarray(recv, dtype=np.int32)

    def reducescatter(self, lane: Lane, r: Response) -> Any:
        sig, (src, _) = r.sig, tensors(r)
        torch = _deps.torch()
        n, rank = self.topo.size, self.topo.rank
        assert src is not None  # joined ranks are refused in negotiation
        if sig.prescale != 1.0:
            src = src.clone()
            scale_(src, sig.prescale)
        trailing = tuple(sig.shape[1:])
        parts = part_sizes(int(sig.shape[0]), n)
        row = math.prod(trailing)
        out = torch.empty((parts[rank], *trailing), dtype=torch_dtype(sig.dtype), device=self.device)
        if n == 1:
            out.copy_(src)
        else:
            lane.group("world").reduce_scatter(src, out, [p * row for p in parts], ReduceOp.SUM)
        if REDUCE_OPS[sig.reduce_op] is ReduceOp.AVERAGE:
            average_(out, n)
        scale_(out, sig.postscale)
        return out


_SINGLE = {
    OpType.ALLGATHER: "allgather",
    OpType.BROADCAST: "broadcast",
    OpType.ALLTOALL: "alltoall",
    OpType.REDUCESCATTER: "reducescatter",
}


def _pack(batch: Sequence[Response], counts: list[int], buf: Any, fill: Any) -> None:
    """Every tensor of the batch into `buf` in order (one cat when this rank has them all); a joined rank's
    entries get the neutral value; the padding (hierarchical: a multiple of the node size) 0."""
    torch = _deps.torch()
    total = sum(counts)
    parts = [tensors(r)[0] for r in batch]
    if all(p is not None for p in parts):
        torch.cat([p.reshape(-1) for p in parts if p is not None], out=buf[:total])
    else:
        off = 0
        for p, n in zip(parts, counts, strict=True):
            region = buf[off : off + n]
            if p is None:
                region.fill_(fill)
            else:
                region.copy_(p.reshape(-1))
            off += n
    if buf.numel() > total:
        buf[total:].zero_()


def _unpack(batch: Sequence[Response], counts: list[int], buf: Any) -> list[Any]:
    """Copy each result out of `buf` (one fused `_foreach_copy_` launch on CUDA)."""
    torch = _deps.torch()
    outs, parts, results = [], [], []
    off = 0
    for r, n in zip(batch, counts, strict=True):
        out = tensors(r)[1]
        if out is not None:
            outs.append(out.view(-1))
            parts.append(buf[off : off + n])
        results.append(out)
        off += n
    if outs:
        torch._foreach_copy_(outs, parts)
    return results


def _on_device(array: np.ndarray[Any, Any], device: Any) -> Any:
    """A host result as a tensor on `device` (a copy queued on the current lane; pageable memory is copied
    before the call returns)."""
    t = to_kind(array, torch_like=True)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


# ---------------------------------------------------------------------- the engine's entry point


class DevicePlane:
    """What the executor calls for batches on a device route; holds one `SetPlane` per set and route."""

    def __init__(self, state: EngineState, host: HostPlane) -> None:
        self._state = state
        self._host = host
        self._sets: dict[int, dict[str, SetPlane]] = {}
        # Counters for tests and benchmarks: batches run here, planes built and released, hierarchical
        # allreduces, staged batches, cross-node stages by carrier, process groups built by kind.
        self.stats = {"batches": 0, "hierarchical": 0, "planes": 0, "released": 0, "staged": 0}
        # (start, end, tensor names) of every batch's lane work, with timing events, while tracing.
        self.trace: list[tuple[Any, Any, list[str]]] | None = None

    def run(
        self, set_id: int, topo: Topology, batch: Sequence[Response], timeline: Timeline | None
    ) -> list[Any]:
        """Execute one agreed batch (identical on every rank of the set); one result per response. On CUDA
        every local request's handle gets the batch's completion event before it completes."""
        route = batch[0].sig.device
        planes = self._sets.setdefault(set_id, {})
        plane = planes.get(route)
        if plane is None:
            plane = planes[route] = SetPlane(topo, route, self._state.settings, self.stats, self._host)
            self.stats["planes"] += 1
        self.stats["batches"] += 1
        lane = plane.next_lane()
        with plane.on_device(), lane.active():
            lane.wait_for(r.local.ready for r in batch if r.local is not None)
            start = self._trace_start(lane)
            results = plane.dispatch(lane, batch, timeline)
            done = lane.done(timing=start is not None)
        if done is not None:
            if start is not None and self.trace is not None:
                self.trace.append((start, done, [r.sig.name for r in batch]))
            for r in batch:
                if r.local is not None:
                    r.local.handle.event = done
        return results

    def _trace_start(self, lane: Lane) -> Any:
        if self.trace is None or lane.stream is None:
            return None
        event = _deps.torch().cuda.Event(enable_timing=True)
        event.record(lane.stream)
        return event

    def release(self, set_id: int) -> None:
        """A process set was removed: shut its process groups down."""
        for plane in self._sets.pop(set_id, {}).values():
            plane.close()
            self.stats["released"] += 1

    def close(self) -> None:
        """Engine shutdown: every set's process groups."""
        for set_id in list(self._sets):
            self.release(set_id)
