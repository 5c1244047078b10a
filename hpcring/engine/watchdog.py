"""The collective watchdog: a rank whose engine has waited on its peers for HPCRING_COLLECTIVE_TIMEOUT ends.

Why a thread of its own: a peer that is frozen (SIGSTOP, a hung driver) or cut off (a dead link or switch
port) leaves the engine's thread inside an MPI call that never returns, so nothing on that thread can look
at a clock. The stall inspector names ranks that stop *submitting*; this covers the case where every rank
submitted (or every engine entered a negotiation round) and the exchange itself never completes.

How cheap: the thread running a cycle writes a new tuple to `Watchdog.current` when it starts a phase
that waits on peers (a negotiation round, or executing the agreed responses) and None when the cycle ends:
attribute writes, no clock, no lock, no wake-up. The watchdog thread wakes every `poll_interval` (a tenth
of the timeout, at most 1 s), notes when it first saw the tuple now there (by identity: it keeps a
reference, so a new tuple is never the same object), and fires when the same one has been there for the
timeout: at most one poll late, never early.

What it does on expiry (docs/guide/launcher.md, "Collective timeout"): a roll call among the peers of the
stuck collective (engine/roll_call.py) finds which of them stopped; then it prints the error (phase, op,
tensor names, the peers not heard from and their hosts, how long it waited), waits `GRACE_S` so the other
survivors print theirs before the first exit makes the launcher end the job, fails this rank's pending
requests with `CollectiveTimeoutError` (a waiter blocked in Python sees it; one blocked in MPI, such as a
caller running the cycle itself, cannot), gives Python `HANDOFF_S` to end the process its own way, then
`os._exit`: never MPI_Finalize, which would wait for the peer that is gone. The status is
COLLECTIVE_TIMEOUT_EXIT_STATUS, or under the elastic driver RESET_EXIT_CODE, the status `@hvd.elastic.run`
uses for a HorovodInternalError: the driver ends the world and relaunches it from the last commit on the same
hosts (a survivor's status cannot say which host is at fault, so it blacklists none; a host that stays
unreachable is the launcher's to find).
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
from hpcring.engine.roll_call import RollCall
from hpcring.engine.set_state import SetState
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS, CollectiveTimeoutError

NEGOTIATION = "negotiation"  # a negotiation round: every rank's engine enters one every few ms, busy or not
EXCHANGE = "exchange"  # executing responses every rank agreed on: every rank submitted them

GRACE_S = 2.0  # from printing the error to raising it to Python (other survivors print theirs meanwhile)
HANDOFF_S = 0.5  # from raising it to Python to ending the process regardless
_NAMES_SHOWN = 8  # tensor names listed per operation; the rest are counted

# (phase, the set, the responses being executed or None); a new tuple per phase, set by the cycle's thread.
Activity = tuple[str, SetState, Sequence[Any] | None]


def poll_interval(timeout_s: float) -> float:
    """How often the watchdog looks: often enough to end within ~10 % of the timeout, never busier than
    20 times a second, and at least once a second."""
    return min(1.0, max(0.05, timeout_s / 10))


def roll_call_window(timeout_s: float) -> float:
    """How long survivors listen for each other: their watchdogs fire up to one poll apart, plus slack."""
    return 2 * poll_interval(timeout_s) + 1.0


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
        roll_call: RollCall | None = None,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.current: Activity | None = None
        self._state = state
        self._rank = rank
        self._hosts = tuple(hosts)  # host name of every rank of the engine's world, by rank
        self._roll_call = roll_call
        self._exit = exit_process
        self._stop = threading.Event()
        self._once = threading.Lock()  # held by the first expiry
        self._thread: threading.Thread | None = None
        self.fired: str | None = None  # the error message, once expired
        self._seen: Activity | None = None  # the record the last poll saw, and since when
        self._seen_at = 0.0

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

    def close(self) -> None:
        """A clean engine shutdown (every rank is there): the roll call's communicator goes too."""
        self.stop()
        if self._roll_call is not None and self.fired is None:
            self._roll_call.free()
            self._roll_call = None

    def _run(self) -> None:
        timeout = self.timeout_s
        while not self._stop.wait(poll_interval(timeout)):
            found = self.observe(time.monotonic())
            if found is not None:
                cur, waited = found
                peers = self.peers(cur)
                heard = None
                if self._roll_call is not None:
                    heard = self._roll_call.call(peers, roll_call_window(timeout))
                self._expire(self.describe(cur, waited, heard))
                return

    def observe(self, now: float) -> tuple[Activity, float] | None:
        """One poll: (the phase in progress, seconds it has waited) once it has been in progress for the
        timeout; the first poll that sees a phase starts its clock."""
        cur = self.current  # one read: the cycle may replace it meanwhile
        if cur is None:
            self._seen = None
            return None
        if cur is not self._seen:
            self._seen, self._seen_at = cur, now
            return None
        timeout = self.timeout_s
        waited = now - self._seen_at
        if timeout <= 0 or waited < timeout:
            return None
        if cur[0] == EXCHANGE and cur[2]:  # the moment negotiation agreed the batch: exact
            waited = max(waited, now - cur[2][0].ready_at)
        return cur, waited

    def peers(self, cur: Activity) -> list[int]:
        """The other ranks of the set the phase waits on (world ranks)."""
        return [r for r in cur[1].ranks if r != self._rank]

    def describe(self, cur: Activity, waited: float, heard: set[int] | None = None) -> str:
        """The error: what this rank was doing, for how long, and which peers it was waiting on; `heard`:
        the peers that answered the roll call (None: it could not run)."""
        phase, st, responses = cur
        where = f"rank {self._rank} (host {self.host(self._rank)})"
        if phase == EXCHANGE:
            what = f"{_ops(responses or ())} in process set {st.id}"
            head = f"{what} has not completed {waited:.1f} s after every rank submitted it"
        else:
            pending = _ops(list(st.inflight.values())) or "nothing pending on this rank"
            head = (
                f"a negotiation round of process set {st.id} has not completed in {waited:.1f} s (every "
                f"rank's engine runs one every few ms, busy or idle; pending here: {pending})"
            )
        return (
            f"hpcring: collective timeout on {where}: {head} (HPCRING_COLLECTIVE_TIMEOUT="
            f"{self.timeout_s:g}). {self._who(self.peers(cur), heard)}"
        )

    def _who(self, peers: list[int], heard: set[int] | None) -> str:
        """Which peers stopped, as far as this rank can tell."""
        if heard is None:
            return (
                f"Not heard from: one or more of ranks {self._listing(peers)}: this rank waits inside MPI, "
                "which does not say which peer stopped; the rank(s) that report no timeout of their own are "
                "the ones that stopped (frozen, or cut off)."
            )
        silent = [r for r in peers if r not in heard]
        alive = [r for r in peers if r in heard]
        answered = f"; ranks {self._listing(alive)} answered" if alive else ""
        if silent:
            return (
                f"Not heard from: rank(s) {self._listing(silent)}: they did not answer a roll call of the "
                f"ranks stuck with this one{answered}, so they stopped (frozen, dead, or cut off)."
            )
        return (
            f"Every peer answered a roll call ({self._listing(peers)}): all are alive and stuck in the same "
            "wait, so MPI itself is not completing it (look at the network or fabric)."
        )

    def _listing(self, ranks: Sequence[int]) -> str:
        return ", ".join(f"{r} (host {self.host(r)})" for r in ranks)

    def host(self, rank: int) -> str:
        """The host of a world rank, as gathered when the engine started."""
        return self._hosts[rank] if 0 <= rank < len(self._hosts) else "unknown"

    def expire_unmatched(self, report: str, submitted: bool) -> None:
        """Every rank of a set learnt in the same cycle that a request waited past the timeout for ranks that
        never submitted it (unmatched.py): say `report` and end this rank, the way an expired exchange does,
        on a thread of its own so the cycle's thread (maybe a caller's) can see the error meanwhile.
        `submitted`: whether this rank submitted any of the waiting requests."""
        mine = "" if submitted else " This rank submitted none of them."
        message = (
            f"hpcring: collective timeout on rank {self._rank} (host {self.host(self._rank)}): {report}"
            f"{mine} (HPCRING_COLLECTIVE_TIMEOUT={self.timeout_s:g})."
        )
        threading.Thread(target=self._expire, args=(message,), name="hpcring-timeout", daemon=True).start()

    def _expire(self, message: str) -> None:
        """Say it; after GRACE_S (the other survivors' watchdogs fire up to a poll later and must say theirs
        before the first to exit makes the launcher end the job) raise it to Python, where a waiter can see
        it, for HANDOFF_S; then end the process. Once: an expired exchange and an unmatched request race.
        """
        if not self._once.acquire(blocking=False):
            return
        self.fired = message
        status = exit_status()
        _say(f"{message} Ending this rank with exit status {status} (no MPI_Finalize).")
        self._pause(GRACE_S)
        self.fail_pending(message)
        self._pause(HANDOFF_S)
        _say("")
        self._exit(status)

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)

    def fail_pending(self, message: str) -> None:
        """Every pending request of this rank fails with the error; new submissions are refused. The engine
        calls it too when it stops after the timeout fired: these words, whichever thread is first."""
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
