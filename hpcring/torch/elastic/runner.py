"""`@hvd.elastic.run`: runs the training function so that it survives a world that changes size.

Under the elastic driver a world that must change is ended and relaunched (docs/dev/elastic.md says why), so
the function is not re-entered in the same process as Horovod's is; instead each world starts like this:

1. every rank looks for the newest commit in its node's commit store; the ranks agree on the newest;
2. the rank that holds it broadcasts it (`state.sync()`), so a new host gets the state with everyone else;
3. if a commit was restored, the reset callbacks run (the world changed: rescale the learning rate);
4. the function runs. On `HostsUpdatedInterrupt` every rank saves its current state and exits with
   `RESET_EXIT_CODE`; on `HorovodInternalError` it exits the same way without saving (the last commit stands).
   The driver relaunches the world at its new size.

Without the elastic driver (no commit store in the environment) the state is synced from rank 0 and the
function runs once; errors propagate, as nothing could re-form the world.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from hpcring.contracts import elastic as contract
from hpcring.errors import CollectiveError
from hpcring.torch import basics, wallclock
from hpcring.torch.elastic import durable, store
from hpcring.torch.elastic.common import HostsUpdatedInterrupt, ObjectState, State, _store_from_env
from hpcring.torch.functions import allgather_object

F = TypeVar("F", bound=Callable[..., Any])


def _resume(state: State) -> bool:
    """Make every rank hold the newest commit (or rank 0's state if none); True if one was found."""
    found = None
    if isinstance(state, ObjectState):
        own = _store_from_env(basics.rank())
        found = own.newest() if own is not None else None
    seqs = allgather_object(found[0] if found else -1, name="elastic.resume")
    best = max(seqs)
    state._sync_root = seqs.index(best) if best >= 0 else 0
    if (
        found is not None
        and best >= 0
        and basics.rank() == state._sync_root
        and isinstance(state, ObjectState)
    ):
        state._pending = store.read_bytes(found[1])
    state.sync()
    return bool(best >= 0)


def _resume_durable(state: State) -> bool:
    """Resume from the job's --checkpoint-dir (a requeued job); the reset callbacks run when the world that
    wrote the checkpoint had another size (rescale the learning rate)."""
    if not isinstance(state, ObjectState) or not durable.resume(state):
        return False
    if durable.resumed_world_size() != basics.size():
        state.on_reset()
    return True


def _exit_for_reset(why: str) -> None:
    """Leave at once for the relaunch: no MPI_Finalize (it would wait for ranks that are gone)."""
    sys.stdout.flush()
    print(
        f"hpcring elastic: rank {basics.rank()}: {why}; exiting for the relaunch", file=sys.stderr, flush=True
    )
    os._exit(contract.RESET_EXIT_CODE)


def run(func: F) -> F:
    """Decorator for the elastic training function; its first argument is the `State` (Horovod's API).

    As in Horovod, the function must not start with a collective of its own before using the state."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        wallclock.install()
        if not os.environ.get(contract.DIRECTORY):
            if not _resume_durable(state):
                state.sync()
            return func(state, *args, **kwargs)
        # The first world of a requeued elastic job starts from the durable checkpoint, later ones from
        # the node-local commits.
        durable_first = contract.generation() == 0 and _resume_durable(state)
        if not durable_first and (_resume(state) or contract.generation() > 0):
            state.on_reset()
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            state.save()
            _exit_for_reset("hosts were updated; state saved")
        except CollectiveError as exc:
            _exit_for_reset(f"a collective failed ({exc}); the last commit stands")
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]
