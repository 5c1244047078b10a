"""The driver's side of one world: a barrier stage of `size` tasks (`hpcring.spark.task`) sharing the
driver's rendezvous store, its results in rank order, and, when the stage fails, which rank failed and how.

Spark aborts a barrier result stage at its first failed task and names that task in its error
(`ResultTask(<stage>, <partition>)`). The task's partition maps to a rank through the `joined/<rank>`
records the tasks publish at start. That rank either reported its failure (`failed/<rank>`: the function
raised, or its worker ended) or it did not: its task was lost (Python worker or executor killed), and the
error names the rank, task, host and executor with Spark's own reason. A stage that fails before any rank
reported counts as lost only when Spark's reason says a process was.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hpcring.errors import ConfigError, LaunchError
from hpcring.spark.task import (
    ENDED,
    FAILED_KEY,
    JOINED_KEY,
    RAISED,
    SHM_KEY,
    SparkJobFailed,
    remove_worker_files,
)

LOST = "lost"  # a task that ended without reporting
# How an executor Python without hpcring refuses a task (`task_function`): found again in Spark's error.
WORKER_REFUSAL = "hpcring.spark: the Spark executors' Python"
# Spark's reasons that say a task's process was lost (the words of Spark 4.3), as opposed to a stage that
# failed for a reason a new world would meet again.
_LOSS_REASONS = ("ExecutorLostFailure", "Python worker exited unexpectedly")
_BLAMED = (re.compile(r"barrier task ResultTask\(\d+, (\d+)\)"), re.compile(r"Task (\d+) in stage"))


def task_function(job: dict[str, Any], payload: bytes) -> Callable[[Iterable[int]], Iterator[bytes]]:
    """What each barrier task runs. It refers to hpcring only inside its body (cloudpickle ships it by value,
    with no module to import first), so that an executor Python without hpcring's task code fails with
    `WORKER_REFUSAL`, naming that Python and the fix, not with a bare ModuleNotFoundError while unpickling."""
    refusal = WORKER_REFUSAL  # a closure cell, not a global of this module

    def task(rows: Iterable[int]) -> Iterator[bytes]:
        import importlib
        import sys

        try:
            for needed in ("cloudpickle", "numpy"):  # the task's own imports, refused here with the fix
                importlib.import_module(needed)
            from hpcring.spark.task import run_task as run
        except ImportError as exc:
            raise RuntimeError(
                f"{refusal} {sys.executable} cannot import hpcring's task code "
                f"({type(exc).__name__}: {exc}); install hpcring with its mpich and spark extras there, or "
                "point PYSPARK_PYTHON (or spark.pyspark.python) at a Python that has it"
            ) from None
        return run(job, payload, rows)

    return task


def worker_refusal(message: str) -> str | None:
    """The one line a task's Python wrote when it could not import hpcring (in Spark's error text)."""
    for line in message.splitlines():
        if WORKER_REFUSAL in line:
            return line[line.index(WORKER_REFUSAL) :].strip()
    return None


class StageFailure(Exception):
    """A failed stage: the error for the caller, and the kind of the failure that ended it (RAISED: the
    function raised, or the stage failed before any rank reported for a reason other than a lost process;
    ENDED: a worker process ended; LOST: a task's process gone without a report)."""

    def __init__(self, error: SparkJobFailed, kind: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.kind = kind


def blamed_partition(message: str) -> int | None:
    """The partition of the task Spark blames for an aborted stage, from its error text."""
    for pattern in _BLAMED:
        found = pattern.search(message)
        if found:
            return int(found.group(1))
    return None


def spark_reason(message: str) -> str:
    """Spark's reason for the failed task: the line after "finished unsuccessfully.", else its first line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.endswith("finished unsuccessfully.") and i + 1 < len(lines):
            return lines[i + 1]
    return lines[0] if lines else "no reason given"


class SparkStage:
    """The rendezvous store of one `run`/`run_elastic` call and the barrier stages that use it."""

    def __init__(self, spark_context: Any, api: str) -> None:
        from hpcring.launch.rendezvous_store import StoreServer

        self.sc = spark_context
        self.api = api
        self.store = StoreServer()
        host = spark_context.getConf().get("spark.driver.host", "127.0.0.1")
        self.address = f"{host}:{self.store.port}"
        # host -> MPICH shared-memory files of lost worlds' workers, not yet removed on that host
        self.stale_files: dict[str, list[str]] = {}

    def job(self, size: int, key: str, timeout: float, env: dict[str, str], **extra: Any) -> dict[str, Any]:
        """What every task of one world gets: size, store, world key, timeout, the workers' variables."""
        return {
            "size": size,
            "store": self.address,
            "token": self.store.token,
            "key": key,
            "timeout": timeout,
            "env": env,
            **extra,
        }

    def run(self, job: dict[str, Any], payload: bytes) -> list[Any]:
        """Run one world as a barrier stage; the results in rank order, or StageFailure."""
        from hpcring import _deps

        cloudpickle = _deps.require("cloudpickle")
        size = int(job["size"])
        for prefix in ("world/", FAILED_KEY, JOINED_KEY, SHM_KEY):
            self.store.clear(prefix)  # a re-formed world must not read the previous one's records
        rdd = self.sc.parallelize(range(size), size).barrier()
        try:
            pickled = rdd.mapPartitions(task_function(job, payload)).collect()
        except Exception as exc:
            self._collect_stale_files(size)
            refusal = worker_refusal(str(exc))
            if refusal is not None:
                raise ConfigError(refusal) from None
            raise self.failure(size, exc) from exc
        results = sorted((cloudpickle.loads(p) for p in pickled), key=lambda pair: pair[0])
        if [r for r, _ in results] != list(range(size)):
            raise LaunchError(f"hpcring.spark.{self.api}: expected one result per rank 0..{size - 1}")
        return [value for _, value in results]

    def _collect_stale_files(self, size: int) -> None:
        """The failed world's workers were killed without MPI_Finalize: remove their shared-memory files
        on this host now, and keep the other hosts' for the next world's tasks there."""
        for record in self._records(SHM_KEY, size).values():
            self.stale_files.setdefault(record["host"], []).extend(record["paths"])
        remove_worker_files(self.stale_files.pop(socket.gethostname(), []))

    def _records(self, prefix: str, size: int) -> dict[int, dict[str, Any]]:
        found = {r: self.store.wait(f"{prefix}{r}", 0) for r in range(size)}
        return {r: json.loads(v) for r, v in found.items() if v is not None}

    def failure(self, size: int, cause: BaseException) -> StageFailure:
        """Which rank ended the stage and how (see the module doc)."""
        text = str(cause)
        failed = self._records(FAILED_KEY, size)
        joined = self._records(JOINED_KEY, size)
        partition = blamed_partition(text)
        by_task = {rec["task"]: rec for rec in joined.values()}
        rank = by_task[partition]["rank"] if partition in by_task else None
        if rank is not None and rank not in failed:
            where = by_task[partition]
            return StageFailure(
                SparkJobFailed(
                    f"hpcring.spark.{self.api}: rank {rank} (Spark task {partition} on {where['host']}, "
                    f"executor {where['executor']}) was lost without a report; the stage's other tasks "
                    f"were ended. Spark's reason: {spark_reason(text)}",
                    rank=rank,
                    task=partition,
                ),
                LOST,
            )
        if not failed:
            reason = spark_reason(text)
            return StageFailure(
                SparkJobFailed(
                    f"hpcring.spark.{self.api}: the Spark job failed before any rank reported: {reason}"
                ),
                LOST if any(words in reason for words in _LOSS_REASONS) else RAISED,
            )
        first = failed[rank] if rank is not None else min(failed.values(), key=lambda rec: rec["time"])
        return StageFailure(
            SparkJobFailed(
                f"hpcring.spark.{self.api}: rank {first['rank']} (Spark task {first['task']} on "
                f"{first['host']}) failed; the stage's other tasks were ended:\n{first['traceback']}",
                rank=int(first["rank"]),
                task=int(first["task"]),
            ),
            RAISED if first.get("kind", RAISED) == RAISED else ENDED,
        )

    def close(self) -> None:
        self.store.close()
