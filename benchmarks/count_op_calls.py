"""Work per small op, counted: Python and C calls per 4-byte `hvd.allreduce_` / `hvd.allreduce`, per thread.

    hpcring run -np 2 -- python benchmarks/count_op_calls.py --ops 2000 --json counts.json

Why counts: on a shared machine wall times of two versions of the code overlap run to run; the calls each
op makes do not. A profile function (`sys.setprofile`, and `threading.setprofile` installed before
`hvd.init()` so the engine's and the watchdog's threads carry it too) counts calls while `--ops` calls of
each op run after a warm-up; rank 0 prints, per op, the calls per op on each thread and each Python
function's calls per op on the calling thread. Only the public API is used, so this script counts any version
of the code (`PYTHONPATH` pointing at another checkout) and two outputs can be compared line by line. Counts
of the polling done while waiting for a peer (C calls, at 2 ranks and more) follow the wait, not the code.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

_counts: collections.Counter[tuple[str, str, str]] = collections.Counter()  # (thread, py|c, where) -> calls
_on = [False]


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if not _on[0]:
        return
    if event == "call":
        code = frame.f_code
        where = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        _counts[(threading.current_thread().name, "py", where)] += 1
    elif event == "c_call":
        _counts[(threading.current_thread().name, "c", getattr(arg, "__qualname__", repr(arg)))] += 1


def count(fn: Callable[[], object], ops: int) -> dict[str, Any]:
    """Calls per op of `ops` calls of `fn` after a warm-up."""
    for _ in range(min(200, ops)):
        fn()
    _counts.clear()
    _on[0] = True
    for _ in range(ops):
        fn()
    _on[0] = False
    threads: collections.Counter[str] = collections.Counter()
    for (thread, kind, _), n in _counts.items():
        threads[f"{thread}/{kind}"] += n
    calling = threading.current_thread().name
    functions = {w: round(n / ops, 3) for (t, k, w), n in _counts.most_common() if t == calling and k == "py"}
    return {"per_thread": {k: round(n / ops, 3) for k, n in sorted(threads.items())}, "functions": functions}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the result here")
    args = p.parse_args()
    threading.setprofile(_profile)  # threads started from here on: the engine's and the watchdog's
    sys.setprofile(_profile)
    import hpcring.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    x = torch.ones(1)
    rows = {
        "allreduce_": lambda: hvd.allreduce_(x, op=hvd.Sum, name="count.in_place"),
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="count.out_of_place"),
    }
    result = {"size": hvd.size(), **{name: count(fn, args.ops) for name, fn in rows.items()}}
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    if hvd.rank() == 0:
        print(json.dumps(result, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    hvd.shutdown()


if __name__ == "__main__":
    main()
