"""Waiting for a non-blocking MPI request without stealing the CPU from the ranks it waits for.

A blocking MPI call busy-polls. When ranks outnumber cores (a laptop, an oversubscribed CI machine), or the
peer is still computing, that spin takes the core the peer needs to arrive. So: spin on Test() for a short
while (peers that are already there answer in microseconds), then sleep with exponential backoff between
tests. Used by the engine's negotiation and by the shared-memory allreduce's node barriers.
"""

from __future__ import annotations

import os
import time
from typing import Any

SPIN_S = 200e-6
MIN_BACKOFF_S = 50e-6
MAX_BACKOFF_S = 500e-6


def wait_polled(req: Any) -> None:
    """Wait for an mpi4py request (anything with `Test()`): spin for SPIN_S, then back off."""
    deadline = time.monotonic() + SPIN_S
    while not req.Test():
        if time.monotonic() >= deadline:
            pause = MIN_BACKOFF_S
            while not req.Test():
                time.sleep(pause)
                pause = min(pause * 2, MAX_BACKOFF_S)
            return


YIELD_S = 0.005


def wait_yielding(req: Any) -> None:
    """Wait for a request that is normally a few microseconds away (a node barrier between phases of one
    collective): test it, yielding the core between tests (`sched_yield`: with ranks outnumbering cores the
    rank the barrier waits for runs at once instead of after a sleep), and after YIELD_S fall back to
    `wait_polled`'s backoff so a long wait does not keep a core busy."""
    deadline = time.monotonic() + YIELD_S
    while not req.Test():
        if time.monotonic() >= deadline:
            wait_polled(req)
            return
        os.sched_yield()
