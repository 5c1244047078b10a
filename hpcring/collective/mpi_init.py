"""MPI's own start and end, when the script leaves them to hpcring (Horovod's MPIContext behaves so).

A script may import mpi4py with `mpi4py.rc.initialize = False` and then call `hpcring.init()`/`hvd.init()`:
hpcring then starts MPI itself at the thread level it needs and finalises it at exit, after its own shutdown.
A script that started MPI itself keeps it, but the thread level must be high enough: the engine thread calls
MPI while the script's thread may too (process sets, broadcast_object, the script's own mpi4py calls), which
only MPI_THREAD_MULTIPLE allows. Anything lower is an error on every rank, before any collective, so no rank
waits for another.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from hpcring.errors import ConfigError

REQUIRED_NAME = "MPI_THREAD_MULTIPLE"
_NAMES = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE")
_state = {"registered": False}


def level_name(MPI: Any, level: int) -> str:
    """MPI_THREAD_* name of a thread level as this MPI library numbers it."""
    for name in _NAMES:
        if getattr(MPI, name.removeprefix("MPI_")) == level:
            return name
    return f"thread level {level}"


def ensure_initialized(MPI: Any, before_finalize: Callable[[], None]) -> None:
    """Start MPI at MPI_THREAD_MULTIPLE when nobody has; check the level when somebody has.

    When hpcring starts MPI it also finalises it at exit: `before_finalize` (hpcring's own shutdown) runs
    first. The handler is registered before the engine exists, and atexit runs handlers last-in first-out,
    so the engine's own exit handler (which stops its thread) runs before it.
    """
    if MPI.Is_finalized():
        raise ConfigError(
            "MPI has already been finalised in this process (MPI.Finalize() was called): hpcring cannot "
            "start after that; call hpcring.init() / hvd.init() before finalising MPI"
        )
    if not MPI.Is_initialized():
        provided = MPI.Init_thread(MPI.THREAD_MULTIPLE)
        if not _state["registered"]:
            _state["registered"] = True
            atexit.register(_finalize_at_exit, MPI, before_finalize)
        if provided < MPI.THREAD_MULTIPLE:
            raise ConfigError(
                f"this MPI library provides only {level_name(MPI, provided)} when asked for {REQUIRED_NAME}, "
                "which hpcring needs (its engine thread calls MPI while the script's thread does); use an "
                "MPI built with thread support (Cray MPICH: set MPICH_MAX_THREAD_SAFETY=multiple)"
            )
        return
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        raise ConfigError(
            f"MPI was initialised with {level_name(MPI, provided)}, but hpcring needs {REQUIRED_NAME} (its "
            "engine thread calls MPI while the script's thread does). Fix: leave mpi4py.rc.thread_level at "
            "its default 'multiple' (do not set it to 'single', 'funneled' or 'serialized'), or call "
            "MPI.Init_thread(MPI.THREAD_MULTIPLE), or set mpi4py.rc.initialize = False and let hpcring "
            "initialise MPI"
        )


def _finalize_at_exit(MPI: Any, before_finalize: Callable[[], None]) -> None:
    """Finalise the MPI that hpcring started, unless someone already did or an engine thread still runs.

    A rank that fails under `hpcring.launch.pyrun` never gets here (it leaves with os._exit, so that its peers
    are not kept waiting in MPI_Finalize). An engine thread that outlived its shutdown could still be inside
    an MPI call: finalising under it could hang, so MPI is left to the process's end then.
    """
    if MPI.Is_finalized() or not MPI.Is_initialized():
        return
    before_finalize()
    if any(t.name == "hpcring-engine" and t.is_alive() for t in threading.enumerate()):
        return
    MPI.Finalize()
