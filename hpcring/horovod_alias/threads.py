"""`horovod.runner.util.threads`: Horovod's small thread helpers, which its test helpers import.

Horovod's `test/utils/common.py` imports `in_thread` at its top, so its whole torch suite needs this module
to collect. The behaviour is Horovod's: `args` must be a tuple, threads are daemons unless asked otherwise,
`silent` swallows the target's exception, `execute_function_multithreaded` returns {index: result}.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any


def _check_args(args: object) -> None:
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")


def in_thread(
    target: Callable[..., Any],
    args: tuple[Any, ...] = (),
    name: str | None = None,
    daemon: bool = True,
    silent: bool = False,
) -> threading.Thread:
    """Start `target(*args)` in a background thread and return the thread."""
    _check_args(args)
    fn = target
    if silent:

        def fn(*a: Any) -> None:
            with contextlib.suppress(Exception):  # silent means swallowed, as Horovod's
                target(*a)

    thread = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(
    event: threading.Event,
    func: Callable[..., Any],
    args: tuple[Any, ...] = (),
    stop: threading.Event | None = None,
    check_stop_interval_s: float = 1.0,
    daemon: bool = True,
    silent: bool = False,
) -> threading.Thread:
    """Run `func(*args)` in a thread once `event` is set, unless `stop` is set first."""
    if event is None:
        raise ValueError("Event must not be None")
    _check_args(args)
    if stop is None and not daemon:
        raise ValueError("Stop event must be given for non-daemon event thread")

    def wait_then_call() -> None:
        if stop is None:
            event.wait()
        else:
            while not event.is_set() and not stop.is_set():
                event.wait(timeout=check_stop_interval_s)
            if stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)


def execute_function_multithreaded(
    fn: Callable[..., Any],
    args_list: Sequence[list[Any]],
    block_until_all_done: bool = True,
    max_concurrent_executions: int = 1000,
) -> dict[int, Any] | None:
    """Call `fn(*args)` for each args of `args_list` on up to `max_concurrent_executions` threads; when
    blocking, return {index in args_list: result} and raise if any call did not complete."""
    work: queue.Queue[tuple[int, list[Any]]] = queue.Queue()
    results: queue.Queue[tuple[int, Any]] = queue.Queue()
    for index, args in enumerate(args_list):
        work.put((index, list(args)))

    def drain() -> None:
        while True:
            try:
                index, args = work.get(block=False)
            except queue.Empty:
                return
            results.put((index, fn(*args)))

    threads = [
        in_thread(drain, daemon=not block_until_all_done)
        for _ in range(min(max_concurrent_executions, len(args_list)))
    ]
    if not block_until_all_done:
        return None
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.1)  # short joins: a signal can still interrupt the wait
    out = dict(results.get() for _ in range(results.qsize()))
    if len(out) != len(args_list):
        raise RuntimeError(f"Some threads for func {fn.__name__} did not complete successfully.")
    return out
