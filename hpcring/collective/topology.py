"""Who is where: the world, node-local and cross-node views of one group of ranks.

A Topology owns duplicates of every communicator it uses, never the user's: our point-to-point ring traffic
and a user's own MPI calls then cannot match each other's messages. Nodes are found with MPI's shared-memory
split; for tests on one machine `HPCRING_EMULATE_NODES=K` instead cuts the ranks into K contiguous blocks
(rank r on node r*K//size), which exercises every inter-node code path without a cluster. Node numbers are
ordered by their lowest rank, so a subset (process set) keeps the node assignment of its parent.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hpcring._deps import mpi
from hpcring.collective.algorithms.chunks import owned_shards
from hpcring.collective.algorithms.hierarchical import NodeLayout
from hpcring.collective.algorithms.shm import SharedSegment
from hpcring.collective.backends import Transport, make_transport
from hpcring.errors import ConfigError

EMULATE_ENV = "HPCRING_EMULATE_NODES"
_SUBSET_TAG = 0x4853


def emulated_nodes(size: int, env: dict[str, str] | None = None) -> list[int] | None:
    """Node of every rank under HPCRING_EMULATE_NODES, or None when unset (a testing aid; see docs)."""
    raw = (os.environ if env is None else env).get(EMULATE_ENV, "").strip()
    if not raw:
        return None
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if not 1 <= k <= size:
        raise ConfigError(
            f"{EMULATE_ENV}={raw!r} is invalid; allowed: an integer from 1 to {size} (the rank count)"
        )
    return [r * k // size for r in range(size)]


def normalize_nodes(nodes: Sequence[int]) -> list[int]:
    """Renumber node labels 0, 1, ... in order of each node's lowest rank."""
    order: dict[int, int] = {}
    for label in nodes:
        order.setdefault(label, len(order))
    return [order[label] for label in nodes]


def _shared_memory_nodes(comm: Any) -> list[int]:
    """Node of every rank from MPI's shared-memory split (labelled by each node's lowest rank)."""
    MPI = mpi()
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        leader = shared.bcast(comm.Get_rank(), root=0)
    finally:
        shared.Free()
    return normalize_nodes(comm.allgather(leader))


class Topology:
    """Immutable view of one group of ranks: world, local (same node) and cross (same local rank) groups."""

    def __init__(self, comm: Any, nodes: Sequence[int], backend: str = "mpi") -> None:
        """Build from an intracomm this object now owns, and every rank's node (the same list everywhere)."""
        self.comm = comm
        self.backend = backend
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.nodes: tuple[int, ...] = tuple(normalize_nodes(nodes))
        self.node: int = self.nodes[self.rank]
        counts = Counter(self.nodes)
        self.node_sizes: tuple[int, ...] = tuple(counts[n] for n in range(len(counts)))
        self.is_homogeneous: bool = len(set(self.node_sizes)) == 1
        self.local_comm = comm.Split(self.node, self.rank)
        self.local_rank: int = self.local_comm.Get_rank()
        self.local_size: int = self.local_comm.Get_size()
        self.cross_comm = comm.Split(self.local_rank, self.node)
        self.cross_rank: int = self.cross_comm.Get_rank()
        self.cross_size: int = self.cross_comm.Get_size()
        self._shard_comms = self._make_shard_comms()
        self._transports: dict[str, Transport] = {}
        self._layout: NodeLayout | None = None
        self._segment: SharedSegment | None = None
        self._freed = False

    def _make_shard_comms(self) -> dict[int, Any]:
        """Cross-node groups per owned shard for the hierarchical allreduce (see hierarchical.py).

        Equal nodes reuse the cross communicator; unequal nodes need one split per shard, made here, eagerly
        and collectively, so no collective operation ever has to create communicators halfway through.
        """
        shards = max(self.node_sizes)
        owned = owned_shards(self.local_rank, shards, self.local_size)
        if self.is_homogeneous:
            return {self.local_rank: self.cross_comm}
        MPI = mpi()
        out = {}
        for shard in range(shards):
            sub = self.comm.Split(0 if shard in owned else MPI.UNDEFINED, self.node)
            if shard in owned:
                out[shard] = sub
        return out

    @classmethod
    def create(cls, comm: Any, backend: str = "mpi") -> Topology:
        """Topology over a duplicate of `comm` (collective over it); nodes emulated or from shared memory."""
        dup = comm.Dup()
        nodes = emulated_nodes(dup.Get_size()) or _shared_memory_nodes(dup)
        return cls(dup, nodes, backend)

    def subset(self, ranks: Sequence[int]) -> Topology:
        """A Topology over the given ranks of this group (for process sets), keeping their nodes.

        Collective over the members only (MPI_Comm_create_group), so ranks outside the set never call it; a
        non-member calling it gets a ConfigError before any communication.
        """
        chosen = sorted(int(r) for r in ranks)
        if len(set(chosen)) != len(chosen) or not chosen:
            raise ConfigError(f"subset ranks must be distinct and non-empty, got {list(ranks)}")
        bad = [r for r in chosen if not 0 <= r < self.size]
        if bad:
            raise ConfigError(f"subset ranks {bad} are out of range; allowed: 0 to {self.size - 1}")
        if self.rank not in chosen:
            raise ConfigError(f"rank {self.rank} is not in the subset {chosen}; only members may create it")
        group = self.comm.Get_group()
        try:
            sub_group = group.Incl(chosen)
            sub = self.comm.Create_group(sub_group, _SUBSET_TAG)
            sub_group.Free()
        finally:
            group.Free()
        return Topology(sub, [self.nodes[r] for r in chosen], self.backend)

    def transport(self, which: str = "world") -> Transport:
        """The backend transport over the world ('world'), node ('local') or cross-node ('cross') group."""
        if which not in self._transports:
            comm = {"world": self.comm, "local": self.local_comm, "cross": self.cross_comm}.get(which)
            if comm is None:
                raise ConfigError(f"unknown group {which!r}; allowed: 'world', 'local' or 'cross'")
            self._transports[which] = make_transport(self.backend, comm)
        return self._transports[which]

    def node_layout(self) -> NodeLayout:
        """The node structure the hierarchical allreduce works on."""
        if self._layout is None:
            groups = {s: make_transport(self.backend, c) for s, c in self._shard_comms.items()}
            self._layout = NodeLayout(self.transport("local"), max(self.node_sizes), groups)
        return self._layout

    def shared_segment(self) -> SharedSegment | None:
        """The group's shared-memory segment for the `shm` allreduce; None unless every rank is on one node.
        Created empty here (no communication); it is sized, collectively, by its first use."""
        if len(self.node_sizes) > 1 or self.size < 2:  # not cross_size: on unequal nodes it differs by rank
            return None
        if self._segment is None:
            self._segment = SharedSegment(self.comm)
        return self._segment

    def describe(self) -> dict[str, Any]:
        """Plain summary (for doctor, bench headers and error messages)."""
        return {
            "rank": self.rank,
            "size": self.size,
            "local_rank": self.local_rank,
            "local_size": self.local_size,
            "cross_rank": self.cross_rank,
            "cross_size": self.cross_size,
            "nodes": len(self.node_sizes),
            "node_sizes": list(self.node_sizes),
            "is_homogeneous": self.is_homogeneous,
            "emulated": bool(os.environ.get(EMULATE_ENV)),
        }

    def free(self) -> None:
        """Release the communicators (idempotent). Collective over the group, like MPI_Comm_free."""
        if self._freed:
            return
        self._freed = True
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        for shard_comm in self._shard_comms.values():
            if shard_comm is not self.cross_comm:
                shard_comm.Free()
        for c in (self.cross_comm, self.local_comm, self.comm):
            c.Free()
        self._transports.clear()
        self._layout = None

    def __repr__(self) -> str:
        return (
            f"Topology(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
            f"local_size={self.local_size}, cross_rank={self.cross_rank}, cross_size={self.cross_size}, "
            f"nodes={list(self.node_sizes)})"
        )
