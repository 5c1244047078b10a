"""A job with a stall, for the stall-inspector test (run by tests/engine/test_engine_stall.py).

Phase 1: the last rank submits `late` 2.5 s after the others: with HPCRING_STALL_CHECK_TIME_SECONDS=1 rank 0
warns, naming the tensor and the missing rank, and the op still completes. Phase 2: the last rank never
submits `never`: with HPCRING_STALL_SHUTDOWN_TIME_SECONDS the engine shuts down and every rank's pending or
later operation raises CollectiveError. Prints one `RESULT` line per rank for the parent to check.
"""

from __future__ import annotations

import time

import numpy as np

import hpcring
from hpcring.config import engine_settings
from hpcring.engine import Engine, OpType, Request, Signature
from hpcring.errors import CollectiveError


def allreduce(engine: Engine, name: str, x: np.ndarray) -> np.ndarray:
    req = Request(Signature(name, OpType.ALLREDUCE, x.dtype.name, x.shape, "sum"), 0, x, np.empty_like(x))
    result: np.ndarray = engine.submit(req).wait()
    return result


def main() -> None:
    topo = hpcring.init()
    n, r = topo.size, topo.rank
    engine = Engine(topo, engine_settings())
    if r == n - 1:
        time.sleep(2.5)
    late = allreduce(engine, "late", np.ones(2))
    assert late.tolist() == [float(n)] * 2
    outcome = "no error"
    try:
        if r == n - 1:
            time.sleep(6.0)  # long past the shutdown time: the engine is gone when we finally submit
        allreduce(engine, "never", np.ones(2))
    except CollectiveError as exc:
        outcome = f"CollectiveError: {exc}"
    print(f"RESULT rank {r}: {outcome}", flush=True)
    engine.shutdown()
    hpcring.shutdown()


if __name__ == "__main__":
    main()
