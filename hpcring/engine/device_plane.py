"""The engine's device data plane: agreed batches of torch tensors that live on a device, moved by
torch.distributed process groups (NCCL for CUDA tensors) instead of numpy and MPI.

The engine hands a batch here when its agreed signature names a device route (`sig.device` in `ROUTES`):

- `"cuda"`: CUDA tensors, NCCL. `hpcring.torch` submits CUDA tensors this way when torch has NCCL; without
  it they are staged through host memory and travel the host path as "cuda+host".
- `"cpu+gloo"`: CPU tensors through the same code with gloo standing in for NCCL
  (`HPCRING_CPU_DEVICE_PLANE=gloo`). gloo is a real backend, so CI runs every line of this module except the
  CUDA-specific ones (device selection, stream synchronisation, pinned staging).

What happens to a batch, per process set (each set has its own process groups, created collectively on the
set's first device batch, in the agreed execution order, and shut down when the set is removed or the engine
stops):

- **allreduce**: fused tensors are packed with one `torch.cat(out=)` into a persistent device buffer per
  dtype (grown, never shrunk), prescaled, reduced, postscaled (Average = Sum then postscale/size, integers
  truncated, exactly as the host path) and copied out with one `torch._foreach_copy_`. A lone tensor is
  reduced in its own output. Joined ranks contribute the neutral value (0, or the dtype's extreme for
  Min/Max, 1 for Product).
- **hierarchical** allreduce when the set spans several nodes with several ranks each (the same `auto` rule
  as the host path, or forced with `HPCRING_ALLREDUCE_ALGORITHM=hierarchical`): NCCL reduce-scatter inside
  the node, allreduce of this rank's shard across nodes (MPI on a host copy of the shard by default, or the
  device backend with `HPCRING_DEVICE_CROSS=nccl`), NCCL allgather inside the node. Written here rather than
  through `algorithms/hierarchical.py`, whose pipeline reduces numpy segments between point-to-point steps:
  on a device the three stages are each one NCCL call. Nodes of unequal size use the flat NCCL allreduce.
- **allgather, broadcast, alltoall, reducescatter**: one process-group call each (row counts and splits are
  exchanged as small MPI messages).

CUDA stream ordering: `hpcring.torch` makes the device's default stream wait (an event, no CPU stall) for the
stream the user produced the tensor on; this thread queues its copies on the default stream, NCCL orders its
own streams after the current one, and before the handles complete this thread waits until the default
stream has finished the batch, so a caller back from `synchronize()` may read the results from any stream.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcring import _deps
from hpcring.collective import kernels
from hpcring.collective.arrays import numpy_view
from hpcring.collective.kernels import TorchTransport, part_sizes
from hpcring.collective.ops import ReduceOp
from hpcring.collective.selection import HIERARCHICAL_MIN_BYTES
from hpcring.collective.stages import (
    CROSS_ALLREDUCE,
    INTRA_ALLGATHER,
    INTRA_REDUCE_SCATTER,
    StageHook,
    unobserved,
)
from hpcring.config import EngineSettings
from hpcring.engine.engine_state import EngineState
from hpcring.engine.request import OpType
from hpcring.engine.timeline import NULL_SPAN, stage_hook
from hpcring.errors import CollectiveError

if TYPE_CHECKING:
    from hpcring.collective.topology import Topology
    from hpcring.engine.responses import Response
    from hpcring.engine.timeline import Timeline

CUDA = "cuda"
CPU_GLOO = "cpu+gloo"
# Agreed device route -> (torch device type, process-group backend).
ROUTES: dict[str, tuple[str, str]] = {CUDA: ("cuda", "nccl"), CPU_GLOO: ("cpu", "gloo")}
# Suffix of the device name of tensors staged through host memory ("cuda+host"): the host path reduces them,
# and validation still tells them apart from CPU tensors on another rank.
HOST_STAGED = "+host"
# dtypes no device route can carry: NCCL has no 16-bit integer type, and gloo (its CPU stand-in) rejects
# int16 too ("Invalid scalar type"). Such tensors take the host path (staged, for device tensors) instead of
# failing.
HOST_ONLY_DTYPES = frozenset({"int16"})
_REDUCE_OPS = {op.value: op for op in ReduceOp}

_last_device: dict[str, Any] = {}  # device type -> the torch.device this process last submitted a tensor on


def note_device(device: Any) -> None:
    """Remember the device this rank's tensors live on (called at submit), so a rank that joined, or whose
    first device batch holds no tensor of its own, contributes on the right device."""
    _last_device[device.type] = device


def route_of(device: str) -> tuple[str, str]:
    """(torch device type, backend) of an agreed device route; CollectiveError naming the known routes."""
    found = ROUTES.get(device)
    if found is None:
        raise CollectiveError(
            f"no device data plane for device {device!r}; known routes: {', '.join(sorted(ROUTES))}"
        )
    return found


def _rank_device(device_type: str, topo: Topology) -> Any:
    """This rank's torch.device of `device_type`: the last one it submitted a tensor on; else (a rank with
    no tensor of its own yet) the conventional one: cuda:LOCAL_RANK (by world rank under emulated nodes)."""
    torch = _deps.torch()
    seen = _last_device.get(device_type)
    if seen is not None:
        return seen
    if device_type == "cuda":
        emulated = os.environ.get("HPCRING_EMULATE_NODES")
        index = int(os.environ.get("RANK" if emulated else "LOCAL_RANK", topo.local_rank))
        return torch.device("cuda", index % max(1, torch.cuda.device_count()))
    return torch.device(device_type)


def tensors(r: Response) -> tuple[Any, Any]:
    """(input, result tensor) of this rank's request in a response, (None, None) for a joined rank. The
    result tensor is the preallocated output, or the input itself for in-place ops and ops without one.
    (The engine's Request annotates numpy arrays; on a device route it carries torch tensors.)"""
    req = r.local
    if req is None:
        return None, None
    t: Any = req.tensor
    out: Any = req.output
    return t, (t if out is None else out)


# ------------------------------------------------------------ torch arithmetic (host-path semantics)


def torch_dtype(name: str) -> Any:
    """torch dtype of an agreed dtype name (the names are torch's too: float32, bfloat16, bool, ...)."""
    return getattr(_deps.torch(), name)


def neutral(op: str, dtype: Any) -> Any:
    """What a joined rank contributes: 0 for Sum/Average (Horovod), the identity for Min/Max/Product."""
    torch = _deps.torch()
    if op == "product":
        return 1
    if op not in ("min", "max"):
        return 0
    if dtype == torch.bool:
        return op == "min"
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.max if op == "min" else info.min


def scale_(buf: Any, factor: float) -> None:
    """Multiply in place with one rounding per element: floats (16-bit ones are computed in float32 by
    torch), integers in float64 truncated toward zero, as `dtypes.scale` does on the host path."""
    if factor == 1.0 or buf.numel() == 0:
        return
    if buf.is_floating_point():
        buf.mul_(factor)
    elif buf.dtype == _deps.torch().bool:
        raise CollectiveError("scale factors apply to numeric dtypes only, not bool")
    else:
        buf.copy_(buf.double().mul_(factor).trunc_())


def average_(buf: Any, n: int) -> None:
    """Sum -> Average over `n` ranks: floats scaled by 1/n, integers divided exactly and truncated (as
    `dtypes.average`)."""
    if n == 1 or buf.numel() == 0:
        return
    if buf.is_floating_point():
        buf.mul_(1.0 / n)
    else:
        buf.copy_(buf.double().div_(n).trunc_())


# ---------------------------------------------------------------------- timeline spans


# ------------------------------------------------------------ the hierarchical allreduce on a device


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
    """While someone measures the stages of this CUDA collective, wait for the GPU so a stage's span ends
    when its work does, not when it was queued; otherwise nothing (the GPU keeps the stages in order)."""
    if t.is_cuda and stages is not unobserved:
        _deps.torch().cuda.current_stream(t.device).synchronize()


# ---------------------------------------------------------------------- per process set


class SetPlane:
    """The device plane of one process set and route: its process groups and persistent buffers."""

    def __init__(
        self, topo: Topology, route: str, settings: EngineSettings, stats: dict[str, int] | None = None
    ) -> None:
        """Collective over the set: every member builds its world process group now, in the same batch."""
        self.topo, self.settings = topo, settings
        self.stats = {} if stats is None else stats
        self.device_type, self.backend = route_of(route)
        self.device = _rank_device(self.device_type, topo)
        self._eager = self.device if self.backend == "nccl" else None
        with self.on_device():
            self.world = TorchTransport(topo.comm, self.backend, self._eager)
        self._local: TorchTransport | None = None
        self._cross: TorchTransport | None = None
        self._buffers: dict[tuple[str, Any], Any] = {}

    # -- lifecycle and buffers

    def on_device(self) -> contextlib.AbstractContextManager[Any]:
        """Make this rank's CUDA device current on the engine thread (which would otherwise use cuda:0)."""
        if self.device_type == "cuda":
            cm: contextlib.AbstractContextManager[Any] = _deps.torch().cuda.device(self.device)
            return cm
        return contextlib.nullcontext()

    def local(self) -> TorchTransport:
        """Process group of this node's ranks (built on the first hierarchical allreduce, collectively)."""
        if self._local is None:
            self._local = TorchTransport(self.topo.local_comm, self.backend, self._eager)
        return self._local

    def cross(self) -> TorchTransport:
        """Process group of the ranks with this local rank, one per node (HPCRING_DEVICE_CROSS=nccl)."""
        if self._cross is None:
            self._cross = TorchTransport(self.topo.cross_comm, self.backend, self._eager)
        return self._cross

    def buffer(self, slot: str, dtype: Any, count: int, *, pinned_host: bool = False) -> Any:
        """`count` elements of a persistent buffer (per slot and dtype; grown by doubling, never shrunk):
        on the device, or in pinned host memory for staging a CUDA shard through MPI."""
        torch = _deps.torch()
        key = (slot, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < count:
            size = max(count, 2 * (0 if buf is None else buf.numel()), 1)
            if pinned_host:
                buf = torch.empty(size, dtype=dtype, pin_memory=self.device_type == "cuda")
            else:
                buf = torch.empty(size, dtype=dtype, device=self.device)
            self._buffers[key] = buf
        return buf[:count]

    def finish(self) -> None:
        """Wait until the device has run everything queued for this batch (CUDA only): the handles complete
        right after, and their callers may read the results from any stream."""
        if self.device_type == "cuda":
            _deps.torch().cuda.default_stream(self.device).synchronize()

    def close(self) -> None:
        """Shut the process groups down (on set removal and engine shutdown)."""
        for t in (self._cross, self._local, self.world):
            if t is not None:
                t.close()
        self._cross = self._local = None
        self._buffers.clear()

    def span(self, timeline: Timeline | None, names: list[str], phase: str) -> Any:
        """A timeline span over the batch's tensors; when recording on CUDA it closes only once the GPU
        work queued inside it is done (so spans show device time)."""
        if timeline is None:
            return NULL_SPAN
        return self._timed(timeline, names, phase)

    @contextlib.contextmanager
    def _timed(self, timeline: Timeline, names: list[str], phase: str) -> Iterator[None]:
        with timeline.span(names, phase):
            yield
            self.finish()

    # -- allreduce

    def hierarchical(self, nbytes: int) -> bool:
        """Run the three-stage allreduce? The same answer on every rank (agreed size, homogeneous layout)."""
        t = self.topo
        if t.cross_size == 1 or t.local_size == 1 or not t.is_homogeneous:
            return False
        algorithm = self.settings.allreduce_algorithm
        return algorithm == "hierarchical" or (algorithm == "auto" and nbytes >= HIERARCHICAL_MIN_BYTES)

    def allreduce(self, batch: Sequence[Response], timeline: Timeline | None) -> list[Any]:
        """One (fused) allreduce; returns each request's output (None for a joined rank's entries)."""
        sig = batch[0].sig
        dtype = torch_dtype(sig.dtype)
        counts = [math.prod(r.sig.shape) for r in batch]
        total = sum(counts)
        hier = self.topo.size > 1 and self.hierarchical(total * dtype.itemsize)
        if hier:
            self.stats["hierarchical"] = self.stats.get("hierarchical", 0) + 1
        pad = (-total) % self.topo.local_size if hier else 0
        names = [r.sig.name for r in batch] if timeline is not None else []
        src, out = tensors(batch[0])
        if len(batch) == 1 and src is not None and pad == 0:  # a lone tensor: reduced in its own output
            with self.span(timeline, names, "COLLECTIVE"):
                flat = out.view(-1)
                if out is not src:
                    flat.copy_(src.view(-1))
                self._reduce(
                    flat, sig.reduce_op, sig.prescale, sig.postscale, hier, stage_hook(timeline, names)
                )
            return [out]
        buf = self.buffer("fusion", dtype, total + pad)
        with self.span(timeline, names, "MEMCPY_IN_FUSION_BUFFER"):
            self._pack(batch, counts, buf, neutral(sig.reduce_op, dtype))
        with self.span(timeline, names, "COLLECTIVE"):
            self._reduce(buf, sig.reduce_op, sig.prescale, sig.postscale, hier, stage_hook(timeline, names))
        with self.span(timeline, names, "MEMCPY_OUT_FUSION_BUFFER"):
            return self._unpack(batch, counts, buf)

    @staticmethod
    def _pack(batch: Sequence[Response], counts: list[int], buf: Any, fill: Any) -> None:
        """Every tensor of the batch into `buf` in order (one cat when this rank has them all); a joined
        rank's entries get the neutral value; the padding (hierarchical: a multiple of the node size) 0."""
        torch = _deps.torch()
        total = sum(counts)
        parts = [tensors(r)[0] for r in batch]
        if all(p is not None for p in parts):
            torch.cat([p.view(-1) for p in parts if p is not None], out=buf[:total])
        else:
            off = 0
            for p, n in zip(parts, counts, strict=True):
                region = buf[off : off + n]
                if p is None:
                    region.fill_(fill)
                else:
                    region.copy_(p.view(-1))
                off += n
        if buf.numel() > total:
            buf[total:].zero_()

    @staticmethod
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

    def _reduce(self, buf: Any, op_name: str, pre: float, post: float, hier: bool, stages: StageHook) -> None:
        """buf (1-D, on the device) = allreduce over the set, with the agreed op and scale factors."""
        op = _REDUCE_OPS[op_name]
        wire = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        scale_(buf, pre)
        if self.topo.size > 1:
            if hier:
                local = self.local()
                shard = self.buffer("shard", buf.dtype, buf.numel() // local.size)
                hierarchical_allreduce(
                    local, buf, shard, wire, lambda s: self._cross_allreduce(s, wire), stages
                )
            else:
                self.world.allreduce(buf, wire)
        scale_(buf, post / self.topo.size if op is ReduceOp.AVERAGE else post)

    def _cross_allreduce(self, shard: Any, op: ReduceOp) -> None:
        """The hierarchical cross-node stage: the device backend, or (default) MPI on a host copy."""
        if self.topo.cross_size == 1:
            return
        key = f"cross_{self.settings.device_cross}"
        self.stats[key] = self.stats.get(key, 0) + 1
        if self.settings.device_cross == "nccl":
            self.cross().allreduce(shard, op)
            return
        host = shard
        if shard.device.type != "cpu":
            host = self.buffer("staging", shard.dtype, shard.numel(), pinned_host=True)
            host.copy_(shard)  # synchronous: the stream has produced the shard when it returns
        kernels.flat_allreduce(self.topo.transport("cross"), numpy_view(host), op)
        if host is not shard:
            # From pinned memory, queued on the stream: the next staging copy into `host` is ordered after
            # it, and the batch ends with a stream synchronisation.
            shard.copy_(host, non_blocking=True)

    # -- the other operations (one process-group call each)

    def allgather(self, r: Response) -> Any:
        sig, (src, _) = r.sig, tensors(r)
        assert src is not None  # joined ranks are refused in negotiation
        trailing = tuple(sig.shape[1:])
        dtype = torch_dtype(sig.dtype)
        torch = _deps.torch()
        rows: list[int] = self.world.allgather_object(int(src.shape[0]))
        row = math.prod(trailing)
        out = torch.empty((sum(rows), *trailing), dtype=dtype, device=self.device)
        if self.topo.size == 1:
            out.copy_(src)
        else:
            self.world.allgatherv(out, [n * row for n in rows], sendbuf=src)
        return out

    def broadcast(self, r: Response) -> Any:
        sig, (_, buf) = r.sig, tensors(r)
        assert buf is not None  # joined ranks are refused in negotiation
        if self.topo.size > 1:
            self.world.bcast(buf.view(-1), sig.root)
        return buf

    def alltoall(self, r: Response) -> tuple[Any, np.ndarray[Any, Any]]:
        req, (src, _) = r.local, tensors(r)
        assert req is not None and src is not None  # joined ranks are refused in negotiation
        torch = _deps.torch()
        n = self.topo.size
        rows = int(src.shape[0])
        send = [int(v) for v in req.splits] if req.splits is not None else [rows // n] * n
        recv: list[int] = self.world.comm.alltoall(send)
        row = math.prod(src.shape[1:])
        out = torch.empty((sum(recv), *src.shape[1:]), dtype=src.dtype, device=src.device)
        if n == 1:
            out.copy_(src)
        else:
            self.world.alltoallv(src, [k * row for k in send], out, [k * row for k in recv])
        return out, np.asarray(recv, dtype=np.int32)

    def reducescatter(self, r: Response) -> Any:
        sig, (src, _) = r.sig, tensors(r)
        torch = _deps.torch()
        dtype = torch_dtype(sig.dtype)
        n, rank = self.topo.size, self.topo.rank
        assert src is not None  # joined ranks are refused in negotiation
        if sig.prescale != 1.0:
            src = src.clone()
            scale_(src, sig.prescale)
        trailing = tuple(sig.shape[1:])
        parts = part_sizes(int(sig.shape[0]), n)
        row = math.prod(trailing)
        out = torch.empty((parts[rank], *trailing), dtype=dtype, device=self.device)
        op = _REDUCE_OPS[sig.reduce_op]
        if n == 1:
            out.copy_(src)
        else:
            self.world.reduce_scatter(src, out, [p * row for p in parts], ReduceOp.SUM)
        if op is ReduceOp.AVERAGE:
            average_(out, n)
        scale_(out, sig.postscale)
        return out


# ---------------------------------------------------------------------- the engine's entry point


class DevicePlane:
    """What the engine calls for batches on a device route; holds one `SetPlane` per set and route."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._sets: dict[int, dict[str, SetPlane]] = {}
        # Counters for tests and benchmarks (engine thread only): batches run here, hierarchical allreduces,
        # process-group sets built and shut down.
        self.stats = {"batches": 0, "hierarchical": 0, "planes": 0, "released": 0}

    def run(
        self, set_id: int, topo: Topology, batch: Sequence[Response], timeline: Timeline | None
    ) -> list[Any]:
        """Execute one agreed batch (identical on every rank of the set); one result per response."""
        route = batch[0].sig.device
        planes = self._sets.setdefault(set_id, {})
        plane = planes.get(route)
        if plane is None:
            plane = planes[route] = SetPlane(topo, route, self._state.settings, self.stats)
            self.stats["planes"] += 1
        self.stats["batches"] += 1
        with plane.on_device():
            results = self._dispatch(plane, batch, timeline)
            plane.finish()
        return results

    @staticmethod
    def _dispatch(plane: SetPlane, batch: Sequence[Response], timeline: Timeline | None) -> list[Any]:
        first = batch[0]
        op = first.sig.op_type
        if op is OpType.ALLREDUCE:
            return plane.allreduce(batch, timeline)
        with plane.span(timeline, [first.sig.name] if timeline is not None else [], "COLLECTIVE"):
            if op is OpType.ALLGATHER:
                return [plane.allgather(first)]
            if op is OpType.BROADCAST:
                return [plane.broadcast(first)]
            if op is OpType.ALLTOALL:
                return [plane.alltoall(first)]
            if op is OpType.REDUCESCATTER:
                return [plane.reducescatter(first)]
        raise CollectiveError(f"{op.value} has no device data plane (device {first.sig.device!r})")

    def release(self, set_id: int) -> None:
        """A process set was removed: shut its process groups down."""
        for plane in self._sets.pop(set_id, {}).values():
            plane.close()
            self.stats["released"] += 1

    def close(self) -> None:
        """Engine shutdown: every set's process groups."""
        for set_id in list(self._sets):
            self.release(set_id)
