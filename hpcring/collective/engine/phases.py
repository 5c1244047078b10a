"""The seam through which collective algorithms report their stages to the engine's timeline.

An algorithm wraps a stage in `with phase("INTRA_REDUCE_SCATTER"): ...`; when no timeline is recording this
costs one global read. The engine installs a listener while a timeline is open and, on its own thread, says
which tensors the running collective belongs to (`set_current`), so stages nest under each tensor's
`COLLECTIVE` span. Collectives called directly from other threads have no current tensors and are not
recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Listener = Callable[[str, bool], None]

_listener: Listener | None = None
_local = threading.local()


def set_listener(listener: Listener | None) -> None:
    """Install (or remove, with None) the function called as listener(stage, begin)."""
    global _listener
    _listener = listener


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Report the enclosed block as stage `name` of the running collective."""
    listener = _listener
    if listener is None:
        yield
        return
    listener(name, True)
    try:
        yield
    finally:
        listener(name, False)


def set_current(timeline: Any, names: Sequence[str]) -> None:
    """Engine thread: the timeline and tensors the next collective on this thread belongs to."""
    _local.current = (timeline, list(names))


def current() -> tuple[Any, list[str]]:
    """(timeline, tensor names) set on this thread, or (None, [])."""
    value: tuple[Any, list[str]] = getattr(_local, "current", (None, []))
    return value
