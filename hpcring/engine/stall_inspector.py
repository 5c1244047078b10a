"""The stall inspector: on the set's rank 0, table entries some ranks submitted long ago are reported with
the ranks that are missing, and a stall longer than the shutdown time aborts on every rank."""

from __future__ import annotations

import logging

from hpcring.engine.engine_state import EngineState
from hpcring.engine.set_state import SetState

log = logging.getLogger("hpcring.engine")


_STALL_CHECK_EVERY_S = 1.0


class StallInspector:
    """Run by the negotiation on the set's rank 0, at most every _STALL_CHECK_EVERY_S."""

    def __init__(self, state: EngineState) -> None:
        self._state = state

    def check(self, st: SetState, now: float) -> None:
        """Rank 0 of the set: warn about names some ranks submitted long ago; decide a stall abort."""
        s = self._state.settings
        if s.stall_check_disable:
            return
        lines = []
        for name, entry in st.table.items():
            age = now - entry.first_seen
            if age < s.stall_check_time_s:
                continue
            if s.stall_shutdown_time_s > 0 and age >= s.stall_shutdown_time_s:
                st.abort = True
            if now - entry.warned_at < s.stall_check_time_s:
                continue
            entry.warned_at = now
            have = sorted(st.ranks[r] for r in entry.sigs)
            missing = sorted(
                st.ranks[r] for r in range(st.size) if r not in entry.sigs and r not in st.joined
            )
            op = next(iter(entry.sigs.values())).op_type.value
            lines.append(
                f"  {name!r} ({op}, waiting {age:.0f} s): submitted by ranks {have}; missing ranks {missing}"
            )
        if lines:
            log.warning(
                "One or more tensors were submitted by a subset of ranks and have been waiting for the "
                "remaining ranks for more than %.0f s (process set %d). Different ranks may be submitting "
                "different tensors, or only some ranks are submitting, which would deadlock.\n"
                "Stalled tensors:\n%s",
                s.stall_check_time_s,
                st.id,
                "\n".join(lines),
            )
        if st.abort:
            log.error(
                "stall lasted more than %.0f s (HPCRING_STALL_SHUTDOWN_TIME_SECONDS): shutting hpcring down",
                s.stall_shutdown_time_s,
            )
