"""The lone request's cycle, compiled: a synchronous small host allreduce without Python on the way.

A thread waiting for its own lone request runs the cycles itself (caller_cycles.py). In the compiled core,
`LoneCycle.run_inline` (core/src/lone.c) takes that over: it makes the same checks, and runs each cycle in C
when it is the plain one: a single process set, this one request in flight and cached, a host allreduce
small enough for MPI's own allreduce (what `auto` picks there) of a dtype and op MPI reduces exactly, no
timeline, no prescale, nothing else pending on the set (no table, join, stall flag or check due). Intake, the
bit vector, the agreement (MPI_Iallreduce, waited on without the GIL), the response, MPI_Allreduce, the
postscale, the response cache's refresh and the completion then make no Python call. Any other cycle is the
Python one, called from C, and an agreement with any other outcome (a peer's flag, a table, not ready) goes
on in Python from the agreed words (`Engine._conclude_lone`): the peers cannot tell which ran.

This module gives the core what it reads once per settings and process set (`describe`) and builds it for an
engine (`build`); it is None on the pure-Python path, which runs caller_cycles.py unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcring.collective import dtypes, kernels
from hpcring.collective.ops import BY_VALUE, ReduceOp
from hpcring.config import EngineSettings
from hpcring.engine import core
from hpcring.engine.caller_cycles import INLINE_MAX_BYTES, CallerCycles, _Ended
from hpcring.engine.engine_state import EngineState, patience_s
from hpcring.engine.host_plane import ENGINE_SHM_MIN_RANKS
from hpcring.engine.request import OpType
from hpcring.engine.responses import Response
from hpcring.engine.set_state import SetState
from hpcring.engine.stall_inspector import _STALL_CHECK_EVERY_S
from hpcring.engine.watchdog import EXCHANGE, NEGOTIATION, Watchdog
from hpcring.errors import CollectiveError

# The float dtypes whose postscale (AVERAGE's 1/size, a postscale factor) the core applies itself, as
# `dtypes.scale` does for them: one multiply in the dtype. Others take the lone path only when it is 1.
_SCALED = {"float32": 1, "float64": 2}


def native_max_bytes(settings: EngineSettings, st: SetState) -> int:
    """The largest request the lone path takes on `st`: what the host plane would hand to MPI's own
    allreduce (the engine's shared-memory minimum), at most INLINE_MAX_BYTES; -1 when the configured
    algorithm never does."""
    return kernels.largest_native(
        st.topology.node_sizes, settings.allreduce_algorithm, ENGINE_SHM_MIN_RANKS, INLINE_MAX_BYTES
    )


def reduce_table(transport: Any, mpi: Any) -> dict[str, dict[str, tuple[int, int, bool, int, int]]]:
    """reduce op name -> dtype name -> (MPI datatype handle, MPI op handle, AVERAGE, scaled kind, numpy type
    number) for every pair MPI reduces exactly on this transport (the others take the Python path)."""
    table: dict[str, dict[str, tuple[int, int, bool, int, int]]] = {}
    for op_name, op in BY_VALUE.items():  # Adasum is not element-wise: never here (host_adasum.py)
        for name in dtypes.SUPPORTED:
            if name in ("bool", "bfloat16"):  # never a plain host view (one_call.py)
                continue
            dt = np.dtype(name)
            found = kernels.mpi_reduction(transport, dt, op)
            if found is None:
                continue
            average = op is ReduceOp.AVERAGE
            handles = (mpi._handleof(found[0]), mpi._handleof(found[1]))
            table.setdefault(op_name, {})[name] = (*handles, average, _SCALED.get(name, 0), dt.num)
    return table


def describe(mpi: Any) -> Callable[[EngineSettings, SetState], tuple[Any, ...]]:
    """What the core reads once per (settings, process set): (largest request in bytes, patience in s or
    None, stall-check period in s, the set's MPI communicator handle, the handles of the
    negotiation words' datatype and op (`Negotiator._agree`'s), the reduce table)."""

    def of(settings: EngineSettings, st: SetState) -> tuple[Any, ...]:
        return (
            native_max_bytes(settings, st),
            patience_s(settings),
            _STALL_CHECK_EVERY_S,
            mpi._handleof(st.comm),
            mpi._handleof(mpi.UINT64_T),
            mpi._handleof(mpi.BAND),
            reduce_table(st.topology.transport(), mpi),
        )

    return of


def build(
    engine: Any, state: EngineState, callers: CallerCycles, watchdog: Watchdog, wake: Any, mpi: Any
) -> Any | None:
    """The core's LoneCycle for `engine`, or None on the pure-Python path (or where the loaded MPI's
    entry points were not found): caller_cycles.py's run_inline then runs as it is."""
    return core.lone_cycle(
        engine=engine,
        state=state,
        callers=callers,
        wake_put=wake.put,
        python_cycle=engine._cycle,
        conclude=engine._conclude_lone,
        watchdog=watchdog,
        negotiation=NEGOTIATION,
        exchange=EXCHANGE,
        response_type=Response,
        ended_type=_Ended,
        error_type=CollectiveError,
        describe=describe(mpi),
        allreduce=OpType.ALLREDUCE,
        handle_size=mpi._sizeof(mpi.Comm),
        in_place=mpi.buffer(mpi.IN_PLACE).address,
    )
