"""The roll call: which peers are still alive when a collective has timed out (engine/watchdog.py).

Why: a rank waiting inside an MPI collective cannot learn from MPI which peer stopped, and every peer of the
collective is a suspect. But the peers that are alive are stuck in the same collective, so their watchdogs
fire within moments of ours: each one sends every peer a one-byte "here" on a communicator of its own and
listens for theirs for a short window. The peers not heard from are the ones that stopped (frozen, dead, or
cut off), and every survivor names the same ones.

It needs MPI_THREAD_MULTIPLE (mpi4py's default), since the engine's thread is still inside MPI, and it runs
on a thread of its own that the watchdog waits for only until the window ends: an MPI library that blocks
this call cannot keep the process from ending.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

_TAG = 0x5243  # "RC"
_POLL_S = 0.02


class RollCall:
    """Built at engine start (collective: it duplicates the world communicator); `call` at expiry only."""

    def __init__(self, mpi: Any, comm: Any) -> None:
        self._mpi = mpi
        self._comm = comm.Dup()
        self._rank: int = comm.Get_rank()

    def available(self) -> bool:
        """MPI_THREAD_MULTIPLE: a second thread may call MPI while the engine's is inside it."""
        try:
            return bool(self._mpi.Query_thread() == self._mpi.THREAD_MULTIPLE)
        except Exception:
            return False

    def call(self, peers: Sequence[int], window_s: float) -> set[int] | None:
        """The peers (ranks of the world communicator) heard from within `window_s`; None when the roll
        call cannot run here or did not finish in time."""
        if not peers or not self.available():
            return None
        result: list[set[int]] = []
        worker = threading.Thread(
            target=lambda: result.append(self._exchange(peers, window_s)),
            name="hpcring-roll-call",
            daemon=True,
        )
        worker.start()
        worker.join(window_s + 1.0)
        return result[0] if result else None

    def _exchange(self, peers: Sequence[int], window_s: float) -> set[int]:
        comm = self._comm
        here = bytearray(b"\x01")
        inboxes = {r: bytearray(1) for r in peers}  # kept alive while MPI may write into them
        recvs = {r: comm.Irecv(inboxes[r], source=r, tag=_TAG) for r in peers}
        sends = [comm.Isend(here, dest=r, tag=_TAG) for r in peers]
        heard: set[int] = set()
        deadline = time.monotonic() + window_s
        while len(heard) < len(peers) and time.monotonic() < deadline:
            heard.update(r for r, req in recvs.items() if r not in heard and req.Test())
            time.sleep(_POLL_S)
        self._sends = sends  # never waited on: a send to a stopped peer may never complete
        return heard

    def free(self) -> None:
        """Engine shutdown (a clean one: every rank is there)."""
        self._comm.Free()
