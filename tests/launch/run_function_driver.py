"""Calls `hpcring.run` as a user's script would: `python run_function_driver.py CASE NP`; prints a JSON line.

Run by tests/launch/test_run_function.py in a subprocess under a timeout, so a hang fails the test instead of
stalling the suite. The functions are defined here, in `__main__`, so they travel pickled by value, as a
script's or a notebook's do. Cases: `values` (a closure over a local, kwargs, the environment), `torch` (an
allreduce through hpcring.torch), `raise` (the last rank raises while the others wait in a collective),
`die` (rank 1 ends without a result), `elastic` (min_num_proc/max_num_proc), `output` (output_filename,
verbose), `interrupt` (Ctrl-C), `where` (each rank's Slurm node, for the Slurm allocation test), `horovod`
(Horovod's shape: `horovod.run(fn)` where fn uses a module-level `import horovod.torch as hvd`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import hpcring


def rank_and_size() -> tuple[int, int]:
    return int(os.environ["HPCRING_RANK"]), int(os.environ["HPCRING_SIZE"])


def values(scale: int, *, shift: int = 0) -> dict[str, Any]:
    rank, size = rank_and_size()
    return {
        "value": rank * scale + size + shift,
        "env": os.environ.get("RUN_FUNCTION_TEST"),
        "horovod": os.environ.get("HPCRING_HOROVOD"),
    }


def torch_allreduce() -> dict[str, float]:
    import torch

    import hpcring.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total.item())}


hvd: Any = None  # horovod.torch in the `horovod` case, as a Horovod script's top-level import


def horovod_train(scale: float) -> tuple[int, int, float, str]:
    """A Horovod script's training function: `hvd` is this module's global (set by main, as a script's
    top-level `import horovod.torch as hvd` sets it), so cloudpickle must send the alias module."""
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() * scale]), op=hvd.Sum, name="horovod_shape.sum")
    return hvd.rank(), hvd.size(), float(total.item()), hvd.__name__


def horovod_run(np: int) -> Any:
    global hvd
    hvd = importlib.import_module("horovod.torch")
    return importlib.import_module("horovod").run(horovod_train, args=(2.0,), np=np)


def raise_on_last() -> int:
    import numpy as np

    rank, size = rank_and_size()
    if rank == size - 1:
        raise ValueError(f"bad input on rank {rank}")
    hpcring.init()  # the others wait for the last rank here until the launcher ends them
    return int(hpcring.allreduce(np.array([rank]), op="sum")[0])


def die_on_one() -> int:
    rank, _ = rank_and_size()
    if rank == 1:
        os._exit(3)
    return rank


def where() -> dict[str, Any]:
    rank, size = rank_and_size()
    return {"rank": rank, "size": size, "node": os.environ.get("SLURMD_NODENAME")}


def sleep_long() -> None:
    import time

    time.sleep(120)


def interrupted(np: int) -> Any:
    """Ctrl-C (SIGINT to the caller) 3 s into a call whose ranks sleep: every rank ends, the call raises."""
    import signal
    import threading

    threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        hpcring.run(sleep_long, num_proc=np)
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
    return "no interrupt"


def print_rank() -> None:
    print(f"hello from rank {rank_and_size()[0]}")


def main() -> None:
    case, np = sys.argv[1], int(sys.argv[2])
    offset = 7
    calls = {
        "values": lambda: hpcring.run(
            lambda: {**values(10, shift=offset - 7), "closure": offset},
            num_proc=np,
            env={"RUN_FUNCTION_TEST": "from env="},
        ),
        "torch": lambda: hpcring.run(torch_allreduce, num_proc=np),
        "raise": lambda: hpcring.run(raise_on_last, num_proc=np),
        "die": lambda: hpcring.run(die_on_one, num_proc=np),
        "elastic": lambda: hpcring.run(
            rank_and_size, num_proc=np, min_num_proc=np, max_num_proc=np + 1, hosts=f"localhost:{np + 1}"
        ),
        "interrupt": lambda: interrupted(np),
        "horovod": lambda: horovod_run(np),
        "where": lambda: hpcring.run(where, num_proc=np, verbose=1),
        "output": lambda: hpcring.run(print_rank, num_proc=np, output_filename="out", verbose=1),
    }
    try:
        out: dict[str, Any] = {"ok": calls[case]()}
    except Exception as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
        out.update({k: getattr(exc, k) for k in ("rank", "host", "traceback", "others") if hasattr(exc, k)})
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
