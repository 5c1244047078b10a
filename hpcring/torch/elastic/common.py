"""Horovod's elastic `State` and `ObjectState`, with commits that can outlive the process.

The semantics are Horovod's (`horovod/common/elastic.py`): `commit()` = `save()` + `check_host_updates()`;
`restore()` undoes uncommitted changes; `sync()` makes every rank hold the same state; reset callbacks run
after the world changed. What differs is where a commit lives: under the elastic driver (`hpcring run
--min-np ...`) `save()` writes it to the node-local commit store (`store.py`), so the relaunched world can
resume from it; otherwise it is kept in this process's memory, as Horovod does. Either way a commit is one
encoded buffer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpcring.contracts import elastic as contract
from hpcring.torch import basics
from hpcring.torch.collective_ops import broadcast_
from hpcring.torch.elastic import durable, store
from hpcring.torch.functions import broadcast_object


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: every rank raises it at the same commit (Horovod's exception).

    `skip_sync` is True when hosts were only added: the current state is still every rank's state."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts were updated: the world is being re-formed")
        self.skip_sync = skip_sync


def _default_bcast(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    return broadcast_object(obj, root_rank=root_rank, name=name)


_RESULTS = ("", contract.ADDED, contract.REMOVED, contract.MIXED)


def _broadcast_notice(timestamp: int, result: str) -> tuple[int, str]:
    """Rank 0's (timestamp, result) on every rank in one small tensor broadcast: it runs at every commit,
    so it costs one collective, not the two (size, then bytes) of broadcast_object."""
    t = torch.tensor([timestamp, _RESULTS.index(result)], dtype=torch.int64)
    broadcast_(t, 0, name="elastic.host_updates")
    return int(t[0]), _RESULTS[int(t[1])]


def _default_rank() -> int:
    return basics.rank()


def _store_from_env(rank: int) -> store.CommitStore | None:
    directory = os.environ.get(contract.DIRECTORY)
    return store.CommitStore(directory, rank) if directory else None


class State:
    """State tracked across workers (Horovod's `hvd.elastic.State`); subclasses say what the state is."""

    def __init__(
        self, bcast_object: Callable[..., Any] | None = None, get_rank: Callable[[], int] | None = None
    ) -> None:
        self._bcast_object = bcast_object or _default_bcast
        self._rank = get_rank or _default_rank
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._last_updated_timestamp = 0
        self._sync_root = 0  # the rank whose state sync() spreads (the holder of the newest commit)

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], Any]]) -> None:
        """Functions to call after each reset (workers added or removed), e.g. to rescale the LR."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run `reset()`, then the reset callbacks (the elastic runner calls it once the re-formed world has
        the state)."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (to node-local memory under the elastic driver), then check for host updates.

        Commits copy every tensor, so commit every few batches rather than every batch: the trade is the
        commit cost against the steps redone after a failure."""
        self.save()
        os.environ[contract.COMMITTED] = "1"
        if isinstance(self, ObjectState):
            durable.at_commit(self)  # a wall-clock warning: checkpoint durably and leave to be requeued
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise `HostsUpdatedInterrupt` on every rank together when the driver announced a host change.

        Rank 0's view is broadcast so all ranks decide alike (as Horovod does)."""
        prev = self._last_updated_timestamp
        notice = contract.read_notice(os.environ.get(contract.NOTIFY))
        mine = (notice.timestamp, notice.result) if notice and notice.timestamp > prev else (prev, "")
        if self._bcast_object is _default_bcast:
            timestamp, result = _broadcast_notice(*mine)
        else:
            timestamp, result = self._bcast_object(mine, 0, "elastic.host_updates")
        self._last_updated_timestamp = int(timestamp)
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(skip_sync=result == contract.ADDED)

    def save(self) -> None:
        """Save the state (Horovod: to host memory)."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Return to the last committed state, undoing any uncommitted change."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank hold the same state."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Reset objects after the world changed, before the callbacks (Horovod's hook; none by default)."""


class ObjectState(State):
    """State made of plain Python values, given as keyword arguments and exposed as attributes.

    Every commit of it (and of `TorchState`, which builds on it) is one encoded buffer: in memory, or a file
    in the node-local commit store under the elastic driver. `sync()` broadcasts that buffer from one rank."""

    def __init__(
        self,
        bcast_object: Callable[..., Any] | None = None,
        get_rank: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> None:
        self._object_names = list(kwargs)
        for name, value in kwargs.items():
            object.__setattr__(self, name, value)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)
        self._seq = 0  # commits made so far: the newest commit across nodes has the highest number
        self._saved: bytearray | None = None  # the in-memory commit when no store is configured
        self._pending: bytearray | None = None  # a commit read from the store, for sync() to spread
        self._store: store.CommitStore | None = None
        self._saved_objects: dict[str, Any] = dict(kwargs)  # the committed plain values, which sync() sends
        self._saved = store.encode_bytes(0, self._snapshot())  # restore() before any commit: the start

    # ---- what the state is (TorchState extends these) --------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        return {"objects": {name: getattr(self, name) for name in self._object_names}}

    def _load(self, snap: dict[str, Any]) -> None:
        for name, value in snap.get("objects", {}).items():
            object.__setattr__(self, name, value)
            if name not in self._object_names:
                self._object_names.append(name)

    # ---- Horovod's operations ---------------------------------------------------------------------------
    def _commit_store(self) -> store.CommitStore | None:
        if self._store is None:
            self._store = _store_from_env(self._rank())
        return self._store

    def save(self) -> None:
        self._seq += 1
        self._keep()

    def _keep(self) -> None:
        """Make the current state commit number `_seq` (in the store, or in this process's memory)."""
        snap = self._snapshot()
        self._saved_objects = dict(snap["objects"])
        target = self._commit_store()
        if target is not None:
            target.write(self._seq, snap)
            self._saved = None
        else:
            lay = store.layout(self._seq, snap)
            if self._saved is None or len(self._saved) != lay.size:
                self._saved = bytearray(lay.size)  # reused by the next commits of the same layout
            store.fill(self._saved, lay)

    def restore(self) -> None:
        target = self._commit_store()
        if self._saved is None and target is not None and target.path.exists():
            seq, snap = store.read(target.path)
        else:
            seq, snap = store.decode(bytearray(self._saved or b""))  # a fresh buffer: tensors may alias it
        self._seq = seq
        self._load(snap)
        self._saved_objects = dict(snap.get("objects", {}))

    def sync(self) -> None:
        """Make every rank hold `_sync_root`'s state and keep it as its commit, at every world size.

        As Horovod's: the plain values sent are the root's *committed* ones (an uncommitted change to them is
        dropped), the handled objects (model, optimizer, sampler) their live state, and every rank loads
        them, so a sampler is repartitioned for this world. Unlike Horovod's, every rank then keeps the
        result as its commit, so `restore()` after `sync()` gives the root's state on every rank (Horovod's
        handlers would go back to each rank's own model)."""
        root = self._sync_root
        if self._rank() == root:
            payload = self._pending if self._pending is not None else self._sync_payload()
            length = torch.tensor([len(payload)], dtype=torch.int64)
        else:
            payload, length = None, torch.zeros(1, dtype=torch.int64)
        broadcast_(length, root, name="elastic.sync.len")
        data = (
            torch.frombuffer(payload, dtype=torch.uint8)
            if payload is not None
            else torch.empty(int(length.item()), dtype=torch.uint8)
        )
        broadcast_(data, root, name="elastic.sync.data")
        self._pending = None
        self._seq, snap = store.decode(data.numpy())
        self._load(snap)
        self._keep()

    def _sync_payload(self) -> bytearray:
        snap = self._snapshot()
        snap["objects"] = dict(self._saved_objects)
        return store.encode_bytes(self._seq, snap)
