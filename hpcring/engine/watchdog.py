"""The collective watchdog: a rank whose engine has waited on its peers for HPCRING_COLLECTIVE_TIMEOUT ends.

Why a thread of its own: a peer that is frozen (SIGSTOP, a hung driver) or cut off (a dead link or switch
port) leaves the engine's thread inside an MPI call that never returns, so nothing on that thread can look
at a clock. The stall inspector names ranks that stop *submitting*; this covers the case where every rank
submitted (or every engine entered a negotiation round) and the exchange itself never completes.

How cheap: the thread running a cycle writes one tuple to `Watchdog.current` when it starts a phase that
waits on peers (a negotiation round, or executing the agreed responses) and None when the cycle ends: two
attribute writes per set and cycle, no lock, no wake-up. The watchdog thread wakes every `poll_s` (a tenth
of the timeout, at most 1 s) and compares the phase's start with the clock.

What it does on expiry (docs/launcher.md, "Collective timeout"): print the error (phase, op, tensor names,
the peers not heard from and their hosts, how long it waited), fail this rank's pending requests with
`CollectiveTimeoutError` (a waiter blocked in Python sees it; one blocked in MPI, such as a caller running
the cycle itself, cannot), give Python `GRACE_S` to end the process its own way, then `os._exit`: never
MPI_Finalize, which would wait for the peer that is gone. The status is COLLECTIVE_TIMEOUT_EXIT_STATUS, or
under the elastic driver RESET_EXIT_CODE, the status `@hvd.elastic.run` uses for a HorovodInternalError:
the driver ends the world and relaunches it from the last commit (it cannot tell which host is at fault
from a survivor's report, so it blacklists none; a host that stays unreachable is the launcher's to find).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hpcring.contracts import elastic as elastic_contract
from hpcring.engine.engine_state import EngineState
from hpcring.engine.set_state import SetState
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS, CollectiveTimeoutError

NEGOTIATION = "negotiation"  # a negotiation round: every rank's engine enters one every few ms, busy or not
EXCHANGE = "exchange"  # executing responses every rank agreed on: every rank submitted them

GRACE_S = 2.0  # after the error is raised to Python, before the process is ended regardless
_NAMES_SHOWN = 8  # tensor names listed per operation; the rest are counted

# (started at, phase, the set, the responses being executed or None); set by the thread running the cycle.
Activity = tuple[float, str, SetState, Sequence[Any] | None]


def poll_interval(timeout_s: float) -> float:
    """How often the watchdog looks: often enough to end within ~10 % of the timeout, never busier than
    20 times a second, and at least once a second."""
    return min(1.0, max(0.05, timeout_s / 10))


def exit_status(env: dict[str, str] | None = None) -> int:
    """The status the process ends with: the elastic driver's "relaunch" under `--min-np`, else our own."""
    e = os.environ if env is None else env
    return (
        elastic_contract.RESET_EXIT_CODE
        if e.get(elastic_contract.DIRECTORY)
        else COLLECTIVE_TIMEOUT_EXIT_STATUS
    )


class Watchdog:
    """One per engine. `current` is written by the cycle; `start()` runs the checking thread (timeout > 0)."""

    def __init__(
        self,
        state: EngineState,
        rank: int,
        hosts: Sequence[str],
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.current: Activity | None = None
        self._state = state
        self._rank = rank
        self._hosts = tuple(hosts)  # host name of every rank of the engine's world, by rank
        self._exit = exit_process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None  # the error message, once expired

    @property
    def timeout_s(self) -> float:
        return self._state.settings.collective_timeout_s

    def start(self) -> None:
        """Start checking (nothing when the timeout is 0: the knob's "off")."""
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hpcring-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """The engine stopped: nothing to watch any more."""
        self._stop.set()

    def _run(self) -> None:
        timeout = self.timeout_s
        while not self._stop.wait(poll_interval(timeout)):
            message = self.check(time.monotonic())
            if message is not None:
                self._expire(message)
                return

    def check(self, now: float) -> str | None:
        """The error message when the phase in progress started `timeout_s` or more before `now`."""
        cur = self.current  # one read: the cycle may replace it meanwhile
        timeout = self.timeout_s
        if cur is None or timeout <= 0 or now - cur[0] < timeout:
            return None
        return self.describe(cur, now - cur[0])

    def describe(self, cur: Activity, waited: float) -> str:
        """The error: what this rank was doing, for how long, and which peers it was waiting on."""
        _, phase, st, responses = cur
        where = f"rank {self._rank} (host {self._host(self._rank)})"
        if phase == EXCHANGE:
            what = f"{_ops(responses or ())} in process set {st.id}"
            head = f"{what} has not completed {waited:.1f} s after every rank submitted it"
            how = "the exchange waits inside MPI, which does not say which of them stopped"
        else:
            pending = _ops(list(st.inflight.values())) or "nothing pending on this rank"
            head = (
                f"a negotiation round of process set {st.id} has not completed in {waited:.1f} s (every "
                f"rank's engine runs one every few ms, busy or idle; pending here: {pending})"
            )
            how = "this rank waits inside MPI for their engines to join the round, and MPI does not say which"
        peers = [r for r in st.ranks if r != self._rank]
        listing = ", ".join(f"{r} (host {self._host(r)})" for r in peers)
        return (
            f"hpcring: collective timeout on {where}: {head} (HPCRING_COLLECTIVE_TIMEOUT="
            f"{self.timeout_s:g}). Not heard from: one or more of ranks {listing}: {how}; the rank(s) that "
            "report no timeout of their own are the ones that stopped (frozen, or cut off)."
        )

    def _host(self, rank: int) -> str:
        return self._hosts[rank] if 0 <= rank < len(self._hosts) else "unknown"

    def _expire(self, message: str) -> None:
        """Say it, raise it to Python where a waiter can see it, and end the process."""
        self.fired = message
        status = exit_status()
        _say(f"{message} Ending this rank with exit status {status} (no MPI_Finalize).")
        self._fail_pending(message)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        _say("")
        self._exit(status)

    def _fail_pending(self, message: str) -> None:
        """Every pending request of this rank fails with the error; new submissions are refused."""
        state = self._state
        got = state.lock.acquire(timeout=1.0)  # never wait on a thread that may be stuck holding it
        try:
            state.closed = True
            pending = [req for st in list(state.sets.values()) for req in list(st.inflight.values())]
        finally:
            if got:
                state.lock.release()
        for req in pending:
            if not req.handle.done():
                with contextlib.suppress(Exception):
                    req.handle.set_error(CollectiveTimeoutError(message))


def _ops(items: Sequence[Any]) -> str:
    """ "allreduce of 'a', 'b' and 3 more; broadcast of 'c'" for responses or requests (both carry `sig`)."""
    by_op: dict[str, list[str]] = {}
    for item in items:
        by_op.setdefault(item.sig.op_type.value, []).append(item.sig.name)
    parts = []
    for op, names in by_op.items():
        shown = ", ".join(repr(n) for n in names[:_NAMES_SHOWN])
        more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
        parts.append(f"{op} of {shown}{more}")
    return "; ".join(parts)


def _say(text: str) -> None:
    """Write to stderr and flush both streams (the process ends without Python's own flushing)."""
    with contextlib.suppress(Exception):
        if text:
            sys.stderr.write(text + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
