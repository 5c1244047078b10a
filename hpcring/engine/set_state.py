"""What the engine keeps for one process set: its queues, negotiation table, response cache and buffers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcring.config import EngineSettings
from hpcring.engine.request import Request, Signature
from hpcring.engine.response_cache import ResponseCache
from hpcring.engine.responses import _Plan

NDArray = np.ndarray[Any, Any]


@dataclass
class Entry:
    """Negotiation-table row: which set ranks announced a name, with what signature."""

    sigs: dict[int, Signature]
    first_seen: float
    warned_at: float = 0.0


class SetState:
    """Everything the engine keeps for one process set this rank belongs to."""

    def __init__(self, set_id: int, ranks: Sequence[int], topology: Any, settings: EngineSettings) -> None:
        self.id = set_id
        self.ranks = tuple(ranks)  # world ranks, in set-rank order
        self.topology = topology
        self.comm = topology.comm
        self.rank: int = topology.rank
        self.size: int = topology.size
        self.cache = ResponseCache(settings.cache_capacity)
        # Both guarded by the engine lock, never replaced (emptied in place): the core's submit keeps them.
        self.inflight: dict[str, Request] = {}  # submit checks duplicates here
        self.incoming: list[Request] = []
        self.outbox: list[Request] = []  # to announce through the table next cycle
        self.announced: dict[str, Request] = {}  # announced through the table, waiting
        self.cached_wait: dict[int, Request] = {}  # bit -> request waiting on the cache path
        self.table: dict[str, Entry] = {}
        self.joined: list[int] = []  # set ranks, in the order their join became known
        self.local_join: Request | None = None
        self.abort = False  # set rank 0 decided to abort on a stall
        self.overdue = False  # set rank 0 saw a request unmatched past the collective timeout (unmatched.py)
        self.unmatched: list[Any] | None = None  # the table when every rank learnt of it (unmatched.snapshot)
        self.fusion = np.empty(0, dtype=np.uint8)
        self.last_stall_check = 0.0
        self.last_patience_scan = 0.0
        self.negotiating: set[str] = set()  # timeline: names with an open NEGOTIATE span
        # (ready bits, cache version, count) of this cycle's cached responses; the plan made for such a key
        self.ready_key: tuple[int, int, int] | None = None
        self.plan_memo: tuple[tuple[int, int, int], _Plan, list[list[int] | None]] | None = None

    def fusion_view(self, dtype: np.dtype[Any], count: int) -> NDArray:
        """`count` elements of `dtype` in the persistent fusion buffer (grown, never shrunk)."""
        need = count * dtype.itemsize
        if self.fusion.nbytes < need:
            self.fusion = np.empty(max(need, 2 * self.fusion.nbytes), dtype=np.uint8)
        return self.fusion[:need].view(dtype)
