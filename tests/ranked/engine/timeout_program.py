"""A job where one rank freezes itself inside a collective, for the collective-timeout tests
(tests/engine/test_engine_timeout.py runs it under `hpcring run` with HPCRING_COLLECTIVE_TIMEOUT set).

`exchange` (default): every rank submits a large allreduce, `big`; the frozen rank's helper thread waits
until its engine is inside the exchange (the watchdog's record says so) and sends the process SIGSTOP, so its
peers are left inside MPI with every rank having submitted the op. `negotiation`: the frozen rank stops right
after submitting `step`, before its engine negotiates it, so its peers wait in a negotiation round. The other
ranks must then end with the timeout error and exit status 70. Prints `FROZEN <epoch seconds>` (the frozen
rank, just before it stops) and `SURVIVED` (a rank the watchdog failed to end) for the parent to check.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

import hpcring
from hpcring.config import engine_settings
from hpcring.engine import Engine, OpType, Request
from hpcring.engine.request import Signature
from hpcring.engine.watchdog import EXCHANGE

FROZEN_RANK = 1
BIG = 8 << 20  # float64 elements: 64 MiB, an exchange long enough to be caught in the middle


def request(name: str, x: np.ndarray) -> Request:
    return Request(Signature(name, OpType.ALLREDUCE, x.dtype.name, x.shape, "sum"), 0, x, np.empty_like(x))


def freeze(why: str) -> None:
    print(f"FROZEN {time.time():.3f} {why}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def freeze_in_exchange(engine: Engine) -> None:
    """Helper thread: SIGSTOP the process once the engine is executing the agreed allreduce."""
    watchdog = engine._watchdog
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cur = watchdog.current
        if cur is not None and cur[0] == EXCHANGE:
            freeze("in the exchange")
            return
        time.sleep(0.0005)
    print("the exchange never started", flush=True)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "exchange"
    topo = hpcring.init()
    r = topo.rank
    engine = Engine(topo, engine_settings())
    warm = engine.submit(request("warm", np.ones(4))).wait()
    assert warm.tolist() == [float(topo.size)] * 4
    if mode == "exchange":
        x = np.ones(BIG)
        if r == FROZEN_RANK:
            threading.Thread(target=freeze_in_exchange, args=(engine,), daemon=True).start()
        engine.submit(request("big", x)).wait()
    else:
        handle = engine.submit(request("step", np.ones(4)))
        if r == FROZEN_RANK:
            freeze("after submitting")
        handle.wait()
    print(f"SURVIVED rank {r}", flush=True)
    engine.shutdown()
    hpcring.shutdown()


if __name__ == "__main__":
    main()
