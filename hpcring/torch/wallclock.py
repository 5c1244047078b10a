"""The ranks' side of a wall-clock warning: `hpcring.torch.on_wall_clock(fn)` and the flag `hvd.elastic`
checks at each commit (docs/guide/elastic.md, "Longer than the wall clock").

`hpcring run` passes the warning its batch script forwards (SIGUSR1 before the time limit, SIGUSR2 on a
preemption; hpcring.contracts.wallclock) to every rank's process. Here a Python signal handler records it and
calls the functions given to `on_wall_clock`. Nothing collective happens in the handler: ranks receive the
signal at different moments, so `hvd.elastic` agrees on it (`durable.agree`) at the next `state.commit()`
(one small allreduce per commit, only in jobs that name a checkpoint directory), writes the durable
checkpoint there and exits with the requeue status.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from hpcring.contracts import wallclock as contract

CODES = {contract.LIMIT: 1, contract.PREEMPT: 2}  # a preemption outranks a limit when both arrived
KINDS = {code: kind for kind, code in CODES.items()}

_lock = threading.Lock()
_hooks: list[Callable[[str], Any]] = []
_received: str | None = None
_installed = False


def on_wall_clock(fn: Callable[[str], Any]) -> None:
    """Call `fn(kind)` on this rank when the job's wall-clock warning arrives; `kind` is "limit" (the
    time limit is near) or "preempt" (the scheduler is taking the nodes back).

    `fn` runs in the main thread, between two Python bytecodes of whatever the rank was doing (Python's
    signal handler), on each rank at its own moment: set a flag there and let the training loop agree on it
    (`hvd.allreduce` of the flag, `op=hvd.Max`) at the end of a step, save, and exit with
    `hpcring.torch.REQUEUE_EXIT_CODE`. `hvd.elastic` scripts need none of this: see `hvd.elastic.run`."""
    with _lock:
        _hooks.append(fn)
    install()


def install() -> None:
    """Handle the warning signals in this process (idempotent; main thread only, as Python requires)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for signum in contract.WARNINGS:
        signal.signal(signum, _on_signal)
    _installed = True


def install_if_configured() -> None:
    """At `hvd.init()`: handle the warnings when the job names a checkpoint directory, so a warning that
    arrives before the training function starts is recorded rather than killing the rank."""
    if contract.checkpoint_dir() is not None:
        install()


def _on_signal(signum: int, _frame: object) -> None:
    global _received
    kind = contract.kind_of(signum)
    if kind is None:
        return
    if _received is None or CODES[kind] > CODES[_received]:
        _received = kind
    for fn in list(_hooks):
        fn(kind)


def received() -> str | None:
    """The warning this rank has received so far (None, "limit" or "preempt")."""
    return _received
