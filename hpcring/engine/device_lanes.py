"""Lanes: the communication streams of the device plane, each with its own process groups and buffers.

A batch runs on one lane, chosen round-robin in the agreed execution order (so every rank puts the same batch
on the same lane). On CUDA a lane is a stream of its own: the batch's copies, packing, NCCL calls and
staging run there, after an event wait (on the GPU, the CPU does not block) for the stream that produced
each tensor, and the batch ends by recording a completion event that the caller's `synchronize()` waits
for. The training stream is never asked to wait for communication until a result is consumed, so gradient
buckets reduce while backward goes on. Several lanes (`HOROVOD_NUM_NCCL_STREAMS`) give batches NCCL
communicators and streams of their own, as Horovod does.

On the CPU (the gloo and MPI stand-ins) a lane has no stream: its work is done when its calls return.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from hpcring import _deps
from hpcring.collective.kernels import TorchTransport
from hpcring.collective.topology import Topology


class Lane:
    """One communication stream (CUDA) and what runs on it."""

    def __init__(
        self, device: Any, carrier: str, topo: Topology, stats: dict[str, int], timeout_s: float = 0.0
    ) -> None:
        torch = _deps.torch()
        self._timeout_s = timeout_s  # HPCRING_COLLECTIVE_TIMEOUT, handed to the process groups
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._carrier = carrier
        self._topo = topo
        self._stats = stats
        self._groups: dict[str, TorchTransport] = {}
        self._buffers: dict[tuple[str, Any], Any] = {}

    def group(self, which: str) -> TorchTransport:
        """The process group over the set's "world", this node's ("local") or one rank per node ("cross")
        communicator, built the first time a batch needs it: collectively, since every rank runs the same
        batch on the same lane."""
        found = self._groups.get(which)
        if found is None:
            comm = {"world": self._topo.comm, "local": self._topo.local_comm, "cross": self._topo.cross_comm}
            eager = self.device if self._carrier == "nccl" else None
            found = self._groups[which] = TorchTransport(comm[which], self._carrier, eager, self._timeout_s)
            key = f"groups_{which}"
            self._stats[key] = self._stats.get(key, 0) + 1
        return found

    def active(self) -> contextlib.AbstractContextManager[Any]:
        """Make this lane's stream the current one on the calling thread (nothing on the CPU)."""
        if self.stream is None:
            return contextlib.nullcontext()
        cm: contextlib.AbstractContextManager[Any] = _deps.torch().cuda.stream(self.stream)
        return cm

    def wait_for(self, events: Iterable[Any]) -> None:
        """Order this lane after the producers' events (on the GPU; no CPU wait)."""
        if self.stream is None:
            return
        seen: set[int] = set()
        for event in events:
            if event is not None and id(event) not in seen:
                seen.add(id(event))
                self.stream.wait_event(event)

    def done(self, timing: bool = False) -> Any:
        """An event recorded after everything queued on this lane so far (None on the CPU); `timing`: one
        that can measure elapsed time (traces)."""
        if self.stream is None:
            return None
        event = _deps.torch().cuda.Event(enable_timing=timing)
        event.record(self.stream)
        return event

    def synchronize(self) -> None:
        """Wait on the CPU until this lane has run everything queued (before MPI reads a staged copy)."""
        if self.stream is not None:
            self.stream.synchronize()

    def buffer(self, slot: str, dtype: Any, count: int, *, host: bool = False) -> Any:
        """`count` elements of a persistent buffer of this lane (per slot and dtype; grown by doubling,
        never shrunk): on the device, or in host memory (pinned for a CUDA lane, so copies are asynchronous
        on the stream)."""
        torch = _deps.torch()
        key = (slot, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < count:
            size = max(count, 2 * (0 if buf is None else buf.numel()), 1)
            if host:
                buf = torch.empty(size, dtype=dtype, pin_memory=self.stream is not None)
            else:
                buf = torch.empty(size, dtype=dtype, device=self.device)
            self._buffers[key] = buf
        return buf[:count]

    def close(self) -> None:
        """Shut this lane's process groups down and drop its buffers."""
        for group in self._groups.values():
            group.close()
        self._groups.clear()
        self._buffers.clear()
