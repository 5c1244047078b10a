"""Process sets: named subgroups of ranks whose collectives are negotiated and run among themselves.

Mirrors `horovod.common.process_sets.ProcessSet`: built from a list of ranks (or an mpi4py communicator whose
members become the ranks), registered either at `init(process_sets=[...])` or later with `add_process_set`,
after which it has an id and answers `rank()`, `size()` and `included()`. `global_process_set` (id 0) is every
rank of the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcring.errors import ConfigError


class ProcessSet:
    """A group of world ranks (ranks of the communicator given to `init`)."""

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        self._my_rank: int | None = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks: list[int] = []  # filled in at registration, from the communicator's group
        else:
            ranks = [int(r) for r in ranks_or_comm]
            if len(set(ranks)) != len(ranks):
                raise ConfigError(f"process set ranks must be distinct, got {ranks}")
            self.ranks = sorted(ranks)

    def _register(self, process_set_id: int, ranks: Sequence[int], my_world_rank: int) -> None:
        self.process_set_id = process_set_id
        self.ranks = list(ranks)
        self._my_rank = self.ranks.index(my_world_rank) if my_world_rank in self.ranks else None

    def _invalidate(self) -> None:
        self.process_set_id = None
        self._my_rank = None

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None until the set is registered)."""
        if self.process_set_id is None:
            return None
        return self._my_rank is not None

    def rank(self) -> int | None:
        """This process's rank inside the set; None when not registered; ValueError for a process outside
        it (as Horovod's)."""
        if self.process_set_id is not None and self._my_rank is None:
            raise ValueError("Process is not part of provided process set.")
        return self._my_rank

    def size(self) -> int | None:
        """Number of ranks in the set (None until registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self.ranks == other.ranks and self.process_set_id == other.process_set_id

    def __hash__(self) -> int:
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
