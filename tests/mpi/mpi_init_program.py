"""Each rank of the MPI-initialisation tests: `python mpi_init_program.py MODE API`.

MODE `lazy`: `mpi4py.rc.initialize = False`, then init and an allreduce, so hpcring must start MPI itself
(and finalise it at exit: the launcher fails the job when a rank exits with MPI still up). MODE `rc-single`:
mpi4py starts MPI at `rc.thread_level = 'single'`; MODE `init-single`: the script calls
`MPI.Init_thread(MPI.THREAD_SINGLE)` itself. In both, init must raise; each rank prints the error, waits for
the others in a barrier (so every rank's line is printed before the launcher ends the job) and re-raises.
API `torch` uses `hpcring.torch` (Horovod's `hvd.init()`), `numpy` the collective API.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import mpi4py

MODE, API = sys.argv[1], sys.argv[2]
if MODE == "rc-single":
    mpi4py.rc.thread_level = "single"
else:
    mpi4py.rc.initialize = False
from mpi4py import MPI  # noqa: E402 (after the rc settings, as a user's script does)

if MODE == "init-single":
    MPI.Init_thread(MPI.THREAD_SINGLE)
rank = int(os.environ["HPCRING_RANK"])
assert MODE == "rc-single" or MODE == "init-single" or not MPI.Is_initialized()


def start_and_sum(x: float) -> float:
    """init(), then the sum of x over the ranks."""
    if API == "torch":
        import torch

        import hpcring.torch as hvd

        init_now(hvd.init)
        return float(hvd.allreduce(torch.tensor([x]), op=hvd.Sum).item())
    import numpy as np

    import hpcring

    init_now(hpcring.init)
    return float(hpcring.allreduce(np.array([x]), op="sum")[0])


def init_now(init: Callable[[], object]) -> None:
    """Call init; on an error, print it, let every rank get here too, and re-raise."""
    try:
        init()
    except Exception as exc:
        print(f"rank {rank} init raised {type(exc).__name__}: {exc}", flush=True)
        MPI.COMM_WORLD.Barrier()
        raise


total = start_and_sum(float(rank + 1))
print(json.dumps({"rank": rank, "sum": total, "level": MPI.Query_thread()}), flush=True)
