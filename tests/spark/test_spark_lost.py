"""`hpcring.spark.run` names a rank whose task is lost without a report: its Spark Python worker SIGKILLed, or
the executor JVM hosting it SIGKILLed, mid-run. Prints the seconds from the kill to the error."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import spark_programs
from spark_kill import Killer, nothing_left, wait_for_slots

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
