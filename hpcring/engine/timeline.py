"""Chrome-trace timeline of the engine (open the file in https://ui.perfetto.dev or chrome://tracing).

One row ("process") per tensor name, as Horovod draws it. Each request shows `NEGOTIATE_<OP>` from submission
until every rank has submitted it (with an instant marker when each rank's submission became known), then
`<OP>` enclosing `QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, the collective itself (with the algorithm's own stages
nested, reported through a `StageHook`, e.g. the three hierarchical stages) and `MEMCPY_OUT_FUSION_BUFFER`.
Events are streamed as they happen so a crashed job still leaves a readable file (Chrome and Perfetto accept
an array without its closing bracket; `close()` writes it). A flusher thread writes buffered events out within
`FLUSH_INTERVAL_S`, as Horovod's writer thread does: a script (or Horovod's own timeline test) may read the
file while the job runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from hpcring.collective.stages import (
    CROSS_ALLREDUCE,
    INTRA_ALLGATHER,
    INTRA_REDUCE_SCATTER,
    StageHook,
    unobserved,
)

# A Chrome trace needs the spans of one track (pid, tid) to nest strictly, and the pipelined hierarchical
# stages overlap, so each is drawn on its own track of the tensor's row; other spans use track 0.
TRACKS: dict[str, int] = {INTRA_REDUCE_SCATTER: 1, CROSS_ALLREDUCE: 2, INTRA_ALLGATHER: 3}


class _NullSpan:
    """The span used when no timeline records: entering and leaving cost two method calls, nothing else."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NULL_SPAN = _NullSpan()


@dataclass
class _Resume:
    """Where a closed trace can be continued: the offset of its closing event, its rows, its clock origin."""

    offset: int
    pids: dict[str, int]
    t0: float


_CLOSED: dict[str, _Resume] = {}
FLUSH_INTERVAL_S = 0.05


class Timeline:
    """Thread-safe writer of one trace file."""

    def __init__(self, path: str, *, mark_cycles: bool = False, rank: int = 0) -> None:
        self.path = os.path.abspath(path)
        self.mark_cycles = mark_cycles
        self.rank = rank
        self._lock = threading.Lock()
        self._dirty = False
        self._closed = threading.Event()
        threading.Thread(target=self._flush_loop, name="hpcring-timeline-flush", daemon=True).start()
        earlier = _CLOSED.pop(self.path, None)
        if earlier is not None and os.path.exists(self.path) and os.path.getsize(self.path) >= earlier.offset:
            # Written and closed earlier by this process (an engine before a shutdown/init, or an earlier
            # start/stop): continue the same trace, so a re-initialised job keeps one valid file.
            self._file: IO[str] | None = open(self.path, "r+", encoding="utf-8")  # noqa: SIM115 - see close()
            self._file.seek(earlier.offset)
            self._file.truncate()
            self._pids, self._t0 = earlier.pids, earlier.t0
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._file.write("[\n")
        self._pids = {}
        self._t0 = time.monotonic()
        # Horovod's field: the wall-clock time of ts 0, which tools use to line up traces of several runs.
        epoch_us = round(time.time() * 1e6)
        args = {"name": f"hpcring engine (rank {rank})", "start_time_since_epoch_in_micros": epoch_us}
        self._write({"name": "process_name", "ph": "M", "pid": 0, "args": args})

    def _ts(self, when: float | None) -> float:
        """Microseconds since the timeline started (monotonic clock, like request timestamps)."""
        return round(((time.monotonic() if when is None else when) - self._t0) * 1e6, 3)

    def _write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(event, separators=(",", ":")) + ",\n")
        self._dirty = True

    def _flush_loop(self) -> None:
        """Write buffered events out every FLUSH_INTERVAL_S while there are any (one flush per interval at
        most, so a busy engine is not slowed by a write per event)."""
        while not self._closed.wait(FLUSH_INTERVAL_S):
            if not self._dirty:
                continue
            with self._lock:
                if self._file is not None:
                    self._file.flush()
                self._dirty = False

    def _pid(self, tensor: str) -> int:
        pid = self._pids.get(tensor)
        if pid is None:
            pid = self._pids[tensor] = len(self._pids) + 1
            self._write({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def begin(
        self,
        tensor: str,
        phase: str,
        *,
        when: float | None = None,
        args: dict[str, Any] | None = None,
        tid: int = 0,
    ) -> None:
        """Open span `phase` on `tensor`'s row; `tid` > 0 puts it on a track of its own (stages that
        overlap in time, which one track could not nest)."""
        with self._lock:
            event: dict[str, Any] = {
                "name": phase,
                "ph": "B",
                "ts": self._ts(when),
                "pid": self._pid(tensor),
                "tid": tid,
            }
            if args:
                event["args"] = args
            self._write(event)

    def end(self, tensor: str, phase: str, *, when: float | None = None, tid: int = 0) -> None:
        with self._lock:
            event = {"name": phase, "ph": "E", "ts": self._ts(when), "pid": self._pid(tensor), "tid": tid}
            self._write(event)

    def instant(self, tensor: str, label: str, *, args: dict[str, Any] | None = None) -> None:
        with self._lock:
            event: dict[str, Any] = {
                "name": label,
                "ph": "i",
                "s": "p",
                "ts": self._ts(None),
                "pid": self._pid(tensor),
            }
            event["tid"] = 0
            if args:
                event["args"] = args
            self._write(event)

    def cycle(self, number: int) -> None:
        """Mark the start of a negotiation cycle (only when HPCRING_TIMELINE_MARK_CYCLES is on)."""
        if not self.mark_cycles:
            return
        with self._lock:
            self._write(
                {
                    "name": "CYCLE_START",
                    "ph": "i",
                    "s": "g",
                    "ts": self._ts(None),
                    "pid": 0,
                    "tid": 0,
                    "args": {"cycle": number},
                }
            )

    @contextmanager
    def span(self, tensors: Iterable[str], phase: str) -> Iterator[None]:
        """`phase` on every tensor of a (fused) batch for the duration of the block."""
        names = list(tensors)
        now = time.monotonic()
        for t in names:
            self.begin(t, phase, when=now)
        try:
            yield
        finally:
            now = time.monotonic()
            for t in names:
                self.end(t, phase, when=now)

    def close(self) -> None:
        """Terminate the JSON array (valid file); a later Timeline on the same path continues it."""
        with self._lock:
            if self._file is None:
                return
            _CLOSED[self.path] = _Resume(self._file.tell(), self._pids, self._t0)
            self._file.write(
                json.dumps(
                    {"name": "trace_end", "ph": "i", "s": "g", "ts": self._ts(None), "pid": 0, "tid": 0}
                )
                + "\n]\n"
            )
            self._file.close()
            self._file = None
            self._closed.set()


def span(timeline: Timeline | None, names: list[str], phase: str) -> Any:
    """`phase` on every tensor of a batch for the duration of a `with` block; nothing without a timeline."""
    if timeline is None:
        return NULL_SPAN
    return timeline.span(names, phase)


def stage_hook(timeline: Timeline | None, names: list[str]) -> StageHook:
    """The hook a collective algorithm reports its stages to: each stage opens and closes on every tensor's
    row, on the stage's own track."""
    if timeline is None:
        return unobserved

    def hook(stage: str, begin: bool) -> None:
        tid = TRACKS.get(stage, 0)
        write = timeline.begin if begin else timeline.end
        for name in names:
            write(name, stage, tid=tid)

    return hook
