"""The seam through which collective algorithms report their stages to the engine's timeline.

An algorithm wraps a stage in `with phase("NAME"): ...`, or, for stages that overlap in time (the pipelined
hierarchical allreduce runs the node reduce-scatter of one segment while earlier segments cross the network),
calls `begin(name)` / `end(name)` around it. When no timeline is recording every call costs one global read,
so algorithms report stages unconditionally. The engine installs a listener while a timeline is open and, on
its own thread, says which tensors the running collective belongs to (`set_current`), so stages nest under
each tensor's `COLLECTIVE` span. Collectives called directly from other threads have no current tensors and
are not recorded.

The three stages of the hierarchical allreduce (host and device) have names and tracks of their own. A
Chrome trace needs the spans of one track (pid, tid) to nest strictly, and pipelined stages overlap, so each
stage is drawn on its own track of the tensor's row (tid 1, 2, 3); other phases nest on the main track (0).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Listener = Callable[[str, bool], None]

# The hierarchical allreduce's stages, each spanning its first to its last segment.
INTRA_REDUCE_SCATTER = "INTRA_REDUCE_SCATTER"  # reduce-scatter among the ranks of a node
CROSS_ALLREDUCE = "CROSS_ALLREDUCE"  # allreduce of each rank's shard among the nodes
INTRA_ALLGATHER = "INTRA_ALLGATHER"  # allgather of the reduced shards among the ranks of a node
TRACKS: dict[str, int] = {INTRA_REDUCE_SCATTER: 1, CROSS_ALLREDUCE: 2, INTRA_ALLGATHER: 3}

_listener: Listener | None = None
_local = threading.local()


def set_listener(listener: Listener | None) -> None:
    """Install (or remove, with None) the function called as listener(stage, begin)."""
    global _listener
    _listener = listener


def recording() -> bool:
    """Is a listener installed? (Lets a device algorithm wait for the GPU only when someone measures.)"""
    return _listener is not None


def begin(name: str) -> None:
    """Stage `name` of the running collective starts (pair with `end`; may overlap other stages)."""
    listener = _listener
    if listener is not None:
        listener(name, True)


def end(name: str) -> None:
    """Stage `name` of the running collective ends."""
    listener = _listener
    if listener is not None:
        listener(name, False)


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


def record(name: str, begin: bool) -> None:
    """The engine's listener: open or close span `name` on each current tensor's row, on the stage's track."""
    timeline, names = current()
    if timeline is None:
        return
    tid = TRACKS.get(name, 0)
    write = timeline.begin if begin else timeline.end
    for n in names:
        write(n, name, tid=tid)
