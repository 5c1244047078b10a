"""Fail-fast runner for Python ranks: `python -m hpcring.launch.pyrun (SCRIPT | -m MODULE | -c CODE) [args]`.

Why: a rank that raises (or calls `sys.exit(1)`, as pytest does on a failed test) after `MPI_Init` would run
mpi4py's `MPI_Finalize` at exit, which waits for the other ranks, which wait in a collective for it: the job
hangs and no launcher can see a failure. This runner behaves exactly like `python SCRIPT` etc., except that
on an unhandled exception or a non-zero exit while MPI is initialised it prints the usual traceback, flushes,
and exits at once without finalising MPI. The wrapper then reports that rank's status and `hpcring run` ends
the others. Unlike `python -m mpi4py`, it does not call `MPI_Abort`, whose job-wide kill would race with (and
blur) the report of which rank failed. `hpcring run` inserts it for Python commands of its own environment.

The printed traceback starts at the user's code: this runner's frames and runpy's (and importlib's, on the way
into a `-m` module) are left out, and the failure is reported to the wrapper (`hpcring.launch.report`).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import types
from collections.abc import Sequence

from hpcring.launch import report

# Modules whose frames lead from this runner into the user's code (runpy is frozen in Python 3.11+, so its
# frames are told by module name, not file).
_LAUNCHER_MODULES = frozenset({"runpy", "importlib._bootstrap", "importlib._bootstrap_external"})


def _mpi_active() -> bool:
    """True when this process initialised MPI and has not finalised it (only then can Finalize hang)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        return bool(mpi.Is_initialized()) and not bool(mpi.Is_finalized())
    except Exception:
        return False


def _exit_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _status(code: object) -> int:
    """The process status Python would use for SystemExit(code); a message is printed like Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _exception_status(exc: BaseException) -> int:
    """1, or the status an hpcring error asks for (a collective timeout's own, so the launcher and scripts
    see the same status whether the watchdog or the uncaught error ends the rank first)."""
    status = getattr(exc, "exit_status", None)
    return status if isinstance(status, int) and 0 < status < 256 else 1


def _launcher_frame(tb: types.TracebackType) -> bool:
    frame = tb.tb_frame
    return frame.f_code.co_filename == __file__ or frame.f_globals.get("__name__") in _LAUNCHER_MODULES


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the first frame of the user's code on (None when it never got there)."""
    while tb is not None and _launcher_frame(tb):
        tb = tb.tb_next
    return tb


def _fail(exc: BaseException, fd: int | None) -> int:
    """Print the exception as Python would, without the launcher's frames, and report it; returns the
    status to exit with."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:  # the exceptions it was raised from or during, too
        seen.add(id(link))
        link.__traceback__ = user_traceback(link.__traceback__)
        link = link.__cause__ or link.__context__
    tb = exc.__traceback__
    sent = report.of_exception(exc, tb)
    report.send(fd, sent)
    if sent.kind == report.DISK:  # one line says it all: the folder and the bytes needed
        print(sent.summary, file=sys.stderr, flush=True)
    else:
        sys.excepthook(type(exc), exc, tb)
    return _exception_status(exc)


def run(args: Sequence[str]) -> None:
    """Run the target as Python's own command line would (sys.argv and sys.path[0] included)."""
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]  # run_module sets argv[0] to the module's path
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(args[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(args)
        path = os.path.abspath(args[0])  # __file__ and tracebacks name it so, as python's own (3.9+)
        sys.path[0] = os.path.dirname(path)
        runpy.run_path(path, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] in ("-m", "-c") and len(args) < 2):
        sys.exit("usage: python -m hpcring.launch.pyrun (SCRIPT | -m MODULE | -c CODE) [args...]")
    fd = report.take_fd()
    try:
        run(args)
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            tb = user_traceback(exc.__traceback__)
            message = code if isinstance(code, str) else None
            report.send(fd, report.of_exit(code if isinstance(code, int) else 1, message, tb))
        status = _status(code) if _mpi_active() else None
        if status:
            _exit_now(status)
        raise
    except KeyboardInterrupt:
        if _mpi_active():
            _exit_now(130)
        raise
    except BaseException as exc:
        status = _fail(exc, fd)
        if _mpi_active():
            _exit_now(status)
        sys.exit(status)


if __name__ == "__main__":
    main()
