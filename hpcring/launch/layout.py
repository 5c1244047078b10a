"""Where each rank sits: node, local rank/size and cross rank/size, from hostnames or an emulated split.

Computed by the launcher once every rank has said which host it runs on, so the values are right whatever
mapping the MPI launcher chose. Cross rank/size follow Horovod: the cross group of a rank is every rank with
the same local rank, ordered by node; on uneven nodes it only spans nodes that have that local rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcring.errors import ConfigError


@dataclass(frozen=True)
class Place:
    """One rank's position in the job."""

    rank: int
    node: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def emulated_nodes(size: int, nodes: int) -> list[int]:
    """Node of each rank when `nodes` contiguous blocks emulate nodes: rank r is on node r * nodes // size."""
    if not 1 <= nodes <= size:
        raise ConfigError(f"--emulate-nodes {nodes} must be between 1 and the number of ranks ({size})")
    return [r * nodes // size for r in range(size)]


def node_of_hosts(hosts: Sequence[str]) -> list[int]:
    """Node index of each rank from its hostname, numbering nodes in order of their lowest rank."""
    index: dict[str, int] = {}
    return [index.setdefault(h, len(index)) for h in hosts]


def places(nodes: Sequence[int]) -> list[Place]:
    """Local and cross values of every rank from the node index of each rank (ranks in order)."""
    members: dict[int, list[int]] = {}
    for rank, node in enumerate(nodes):
        members.setdefault(node, []).append(rank)
    order = sorted(members, key=lambda n: members[n][0])
    out: list[Place] = []
    for rank, node in enumerate(nodes):
        local = members[node]
        local_rank = local.index(rank)
        # Nodes that have a rank with this local rank, in node order: the cross group.
        cross = [n for n in order if len(members[n]) > local_rank]
        out.append(Place(rank, node, local_rank, len(local), cross.index(node), len(cross)))
    return out
