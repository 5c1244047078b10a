"""What the Spark tests use to find and kill the processes of a run (importable by name from tests/spark)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

EXECUTOR_CLASS = b"CoarseGrainedExecutorBackend"


def processes_with(marker: str) -> list[int]:
    """Pids of processes whose environment holds `marker` (the workers of one test's run)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as env:
                if marker.encode() in env.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def wait_for_pid(path: Path, timeout: float) -> int:
    """The pid a rank wrote to `path` (spark_programs._note_pid), waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"no rank wrote {path} within {timeout:g} s")
        time.sleep(0.2)
    return int(path.read_text())


def executor_jvm(pid: int) -> int:
    """The executor JVM (`CoarseGrainedExecutorBackend`) that `pid` descends from."""
    while pid > 1:
        if EXECUTOR_CLASS in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("the process does not run under a Spark executor JVM")


def kill(pid: int) -> float:
    """SIGKILL `pid`; the monotonic time of the kill."""
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def wait_for_slots(spark_context: Any, slots: int, timeout: float) -> float:
    """Wait until the cluster has `slots` task slots again (the standalone worker relaunches a killed
    executor), so the next tests find the cluster as it was; the seconds it took."""
    start = time.monotonic()
    while spark_context.defaultParallelism < slots:
        if time.monotonic() - start > timeout:
            pytest.fail(f"the cluster has {spark_context.defaultParallelism} task slots after {timeout:g} s")
        time.sleep(0.5)
    return time.monotonic() - start


def _committed(pid_dir: Path) -> int:
    """The epochs generation 0 committed so far, as its rank 0 notes them (spark_programs)."""
    try:
        return int((pid_dir / "committed.0").read_text())
    except (OSError, ValueError):
        return 0


class Killer(threading.Thread):
    """Waits until every rank of generation 0 wrote its pid (spark_programs._note_pid) and, with
    `committed`, until rank 0 of generation 0 noted that many epochs committed, then kills rank `rank`'s
    task process (or, `executor=True`, its executor JVM). `lost`: the ranks the kill takes down."""

    def __init__(self, pid_dir: Path, size: int, rank: int, executor: bool, committed: int = 0) -> None:
        super().__init__(daemon=True)
        self.pid_dir, self.size, self.rank, self.executor = pid_dir, size, rank, executor
        self.committed = committed
        self.lost: set[int] = set()
        self.at = 0.0
        self.wall_clock_at = 0.0  # time.time() of the kill, to compare with the workers' clocks

    def run(self) -> None:
        pids = [wait_for_pid(self.pid_dir / f"0.{r}", 120) for r in range(self.size)]
        owners = [executor_jvm(p) if self.executor else p for p in pids]
        self.lost = {r for r in range(self.size) if owners[r] == owners[self.rank]}
        time.sleep(1.0)
        deadline = time.monotonic() + 120
        while self.committed and _committed(self.pid_dir) < self.committed and time.monotonic() < deadline:
            time.sleep(0.1)
        self.wall_clock_at = time.time()
        self.at = kill(owners[self.rank])


def nothing_left(marker: str) -> None:
    """No process carrying `marker` (the run's workers and their mpiexec) within 20 s."""
    deadline = time.monotonic() + 20
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with(marker) == []
