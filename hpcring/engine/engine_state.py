"""What the engine's parts share, owned by `Engine` and handed to each part when it is built.

Each part (negotiation, execution, the host and device planes, the caller-run cycle) takes this object and
nothing else of the engine's, so a part can be read, tested and type-checked on its own."""

from __future__ import annotations

from hpcring.config import EngineSettings
from hpcring.engine.core import Lock
from hpcring.engine.set_state import SetState
from hpcring.engine.timeline import Timeline


class EngineState:
    """The settings in force (an agreed `tune` replaces them), the counters, the engine lock and what it
    guards (per-set queues, the closing flag), and the timeline being written, if any."""

    __slots__ = ("closed", "lock", "sets", "settings", "stats", "timeline")

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.lock = Lock()  # the core's: its submit takes it in C
        self.sets: dict[int, SetState] = {}  # the sets this rank is a member of, by id
        # Shutdown requested on this rank (it propagates in the next cycle), or the engine thread ended.
        self.closed = False
        self.timeline: Timeline | None = None
        # Counters for tests and benchmarks, written by whichever thread holds the cycle lock.
        self.stats = {
            "cycles": 0,
            "exchanges": 0,
            "cache_hits": 0,
            "table_ready": 0,
            "batches": 0,
            "fused": 0,
            "no_pack": 0,  # fused batches reduced straight from the callers' adjacent inputs
            "no_unpack": 0,  # fused batches reduced straight into the callers' adjacent outputs
            "shm": 0,  # fused batches and contiguous requests reduced through the node's shared memory
            "tunes": 0,  # Engine.tune requests applied
            "inline": 0,  # waits whose cycles the waiting thread ran itself (caller_cycles.py)
            "lone": 0,  # of their cycles, those the compiled core ran without Python (lone_cycle.py)
        }

    def work_pending(self) -> bool:
        """Anything in flight on this rank (engine lock held by the caller)."""
        return any(st.inflight for st in self.sets.values())


def patience_s(settings: EngineSettings) -> float | None:
    """How long a cached request waits before it goes through the negotiation table, where a stall warning
    and the collective timeout can name the ranks missing it: half of whichever of the two comes first
    (None: never, both are off)."""
    stall = None if settings.stall_check_disable else settings.stall_check_time_s / 2
    timeout = settings.collective_timeout_s / 2
    return stall if timeout <= 0 or (stall is not None and stall <= timeout) else timeout
