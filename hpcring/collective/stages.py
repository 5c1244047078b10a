"""How a collective algorithm reports its stages to whoever measures it (the engine's timeline).

The caller passes a `StageHook`; the algorithm calls `hook(stage, True)` when a stage begins and
`hook(stage, False)` when it ends. Stages may overlap (the pipelined hierarchical allreduce runs the node
reduce-scatter of one segment while earlier segments cross the network). Algorithms never import the
caller: the default hook does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

StageHook = Callable[[str, bool], None]

# The hierarchical allreduce's stages (host and device), each spanning its first to its last segment.
INTRA_REDUCE_SCATTER = "INTRA_REDUCE_SCATTER"  # reduce-scatter among the ranks of a node
CROSS_ALLREDUCE = "CROSS_ALLREDUCE"  # allreduce of each rank's shard among the nodes
INTRA_ALLGATHER = "INTRA_ALLGATHER"  # allgather of the reduced shards among the ranks of a node
HIERARCHICAL_STAGES = (INTRA_REDUCE_SCATTER, CROSS_ALLREDUCE, INTRA_ALLGATHER)


def unobserved(stage: str, begin: bool) -> None:
    """The hook used when nobody measures."""
