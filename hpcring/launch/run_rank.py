"""A rank's side of `hpcring.run`: `python -m hpcring.launch.run_rank FOLDER` (see run_function).

Loads the call from FOLDER/payload, runs it and leaves the pickled return value in FOLDER. An exception (or
a return value that cannot be pickled) is left as text instead, the usual traceback is printed, and the rank
exits with status 1 at once, without finalising MPI (as hpcring.launch.pyrun does), so the launcher ends
the other ranks instead of letting them wait in a collective.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from hpcring.files import write_whole
from hpcring.launch.pyrun import _exit_now, _mpi_active
from hpcring.launch.run_function import PAYLOAD, error_name, result_name


def _fail(folder: Path, rank: int, exc: BaseException) -> None:
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb  # from the user's frames on
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    sys.stderr.write(text)
    report = {
        "rank": rank,
        "host": socket.gethostname(),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": text,
    }
    write_whole(folder / error_name(rank), json.dumps(report).encode())
    if _mpi_active():
        _exit_now(1)
    sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.exit("usage: python -m hpcring.launch.run_rank FOLDER (started by hpcring.run)")
    folder = Path(args[0])
    rank = int(os.environ.get("HPCRING_RANK", "0"))
    size = int(os.environ.get("HPCRING_SIZE", "1"))
    if not (folder / PAYLOAD).is_file():
        sys.exit(
            f"hpcring.run: rank {rank} on {socket.gethostname()} cannot see {folder}: ranks on other hosts "
            "need the caller's working directory on a shared filesystem"
        )
    try:
        with open(folder / PAYLOAD, "rb") as f:
            caller_path = pickle.load(f)
            sys.path[:0] = [p for p in caller_path if p not in sys.path]  # the caller's modules, by name
            fn, fargs, fkwargs = pickle.load(f)
        value = fn(*fargs, **fkwargs)
        from hpcring._deps import require

        data = require("cloudpickle").dumps(value)
    except BaseException as exc:  # every failure goes back to the caller
        _fail(folder, rank, exc)
        return
    write_whole(folder / result_name(rank, size), data)


if __name__ == "__main__":
    main()
