"""`hpcring.spark.run` names a rank whose task is lost without a report: its Spark Python worker SIGKILLed, or
the executor JVM hosting it SIGKILLed, mid-run. Prints the seconds from the kill to the error."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import spark_programs
from spark_kill import Killer, nothing_left, wait_for_slots

from hpcring.spark.stage import LOST, SparkStage, blamed_partition, spark_reason
from hpcring.spark.task import ENDED, RAISED

pytestmark = pytest.mark.timeout(300)


def _run_and_kill(tmp_path: Path, num_proc: int, executor: bool) -> tuple[Any, Killer]:
    """Run allreduce_until_killed with one rank killed; the SparkJobFailed raised and the killer."""
    import hpcring.spark

    marker = f"HPCRING_SPARK_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    killer = Killer(tmp_path, num_proc, rank=1, executor=executor)
    killer.start()
    with pytest.raises(hpcring.spark.SparkJobFailed, match=r"was lost without a report") as failed:
        hpcring.spark.run(
            spark_programs.allreduce_until_killed,
            args=(str(tmp_path), 120),
            num_proc=num_proc,
            env={name: value},
        )
    what = "executor JVM" if executor else "Python worker"
    print(f"{what} of rank 1 killed → SparkJobFailed after {time.monotonic() - killer.at:.1f} s")
    killer.join()
    nothing_left(marker)
    return failed.value, killer


def test_a_killed_task_is_named(spark: Any, tmp_path: Path) -> None:
    error, _ = _run_and_kill(tmp_path, num_proc=2, executor=False)
    assert error.rank == 1
    assert error.task is not None
    assert f"rank 1 (Spark task {error.task} on " in str(error)
    assert "Python worker exited unexpectedly" in str(error)


def test_a_killed_executor_is_named(spark: Any, tmp_path: Path) -> None:
    try:
        error, killer = _run_and_kill(tmp_path, num_proc=4, executor=True)
        # Spark blames one of the executor's tasks: any rank that executor hosted.
        assert error.rank in killer.lost
        assert f"rank {error.rank} (Spark task {error.task} on " in str(error)
        assert "ExecutorLostFailure" in str(error)
    finally:
        print(f"4 task slots again after {wait_for_slots(spark.sparkContext, 4, 180):.1f} s")


# Spark 4.3's text for the two kills above (abridged to the lines that are read).
PYTHON_WORKER_KILLED = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed "
    "barrier ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(0, 1) "
    "finished unsuccessfully.\n"
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed).\n"
    "Caused by: java.io.EOFException"
)
EXECUTOR_KILLED = (
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed "
    "barrier ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(1, 3) "
    "finished unsuccessfully.\n"
    "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: Command exited with "
    "code 137"
)


def test_the_blamed_task_and_reason_are_read_from_spark_text() -> None:
    assert blamed_partition(PYTHON_WORKER_KILLED) == 1
    assert spark_reason(PYTHON_WORKER_KILLED) == (
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)."
    )
    assert blamed_partition(EXECUTOR_KILLED) == 3
    assert spark_reason(EXECUTOR_KILLED).startswith("ExecutorLostFailure (executor 1 exited")
    assert blamed_partition("Task 2 in stage 4.0 failed 1 times") == 2
    assert blamed_partition("no task here") is None
    assert spark_reason("\n  first line\nsecond") == "first line"


@pytest.mark.parametrize(
    ("records", "text", "kind", "named"),
    [
        ({}, EXECUTOR_KILLED, LOST, "failed before any rank reported: ExecutorLostFailure"),
        ({}, "Task 0 in stage 3.0 failed: ModuleNotFoundError: No module x", RAISED, "ModuleNotFound"),
        ({"joined/1": {"rank": 1, "task": 3}}, EXECUTOR_KILLED, LOST, "task 3 on h, executor 7"),
        (
            {"joined/1": {"rank": 1, "task": 3}, "failed/1": {"rank": 1, "task": 3, "kind": ENDED}},
            EXECUTOR_KILLED,
            ENDED,
            "rank 1 (Spark task 3 on h) failed",
        ),
        (
            {"failed/0": {"rank": 0, "task": 0, "kind": RAISED}},
            "Task 2 in stage 1.0 failed",
            RAISED,
            "rank 0 (Spark task 0 on h) failed",
        ),
    ],
)
def test_a_failed_stage_is_classified(
    spark: Any, records: dict[str, dict[str, Any]], text: str, kind: str, named: str
) -> None:
    """The driver's reading of a failed stage from the tasks' records (as the tasks write them) and
    Spark's error text."""
    stage = SparkStage(spark.sparkContext, "run")
    try:
        for key, record in records.items():
            full = {"host": "h", "executor": "7", "time": 1.0, "traceback": "Traceback: x", **record}
            stage.store.set(key, json.dumps(full))
        failure = stage.failure(4, RuntimeError(text))
    finally:
        stage.close()
    assert failure.kind == kind
    assert named in str(failure.error)
