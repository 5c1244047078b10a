"""`hpcring.spark.run` on a real local Spark cluster (conftest): results in rank order, an allreduce across
the tasks, a failing task named with its traceback, and refusals before anything starts."""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

import pytest
import spark_programs
from spark_kill import processes_with
from support import horovod_script_train

from hpcring.errors import ConfigError
from hpcring.horovod_alias import install, uninstall
from hpcring.spark.task import ranks_by_host

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("num_proc", [2, 4])
def test_ranks_layout_and_allreduce(spark: Any, num_proc: int) -> None:
    import hpcring.spark

    results = hpcring.spark.run(spark_programs.layout_and_sum, num_proc=num_proc, start_timeout=120)
    total = float(num_proc * (num_proc + 1) // 2)
    # One host: local ranks equal ranks (two executors on it, their tasks consecutive).
    assert results == [(r, num_proc, r, num_proc, total) for r in range(num_proc)]


def test_horovod_spark_run_sends_a_function_using_a_module_level_horovod_torch(spark: Any) -> None:
    """Horovod's Spark shape: `horovod.spark.run(train, num_proc=2)`, train using the script's
    `import horovod.torch as hvd` (the alias module travels by reference)."""
    install()
    try:
        import horovod.spark

        results = horovod.spark.run(horovod_script_train(), args=(2.0,), num_proc=2)
    finally:
        uninstall()
    assert results == [(r, 2, 2.0, "horovod.torch") for r in range(2)]


def test_args_and_kwargs_reach_every_rank(spark: Any) -> None:
    import hpcring.spark

    num_proc = 4

    results = hpcring.spark.run(spark_programs.scaled, args=(3,), kwargs={"offset": 10}, num_proc=num_proc)
    assert results == [{"rank": r, "value": 3 * r + 10 * num_proc} for r in range(num_proc)]


def test_a_failing_task_is_named_and_nothing_is_left(spark: Any) -> None:
    import hpcring.spark

    marker = f"HPCRING_SPARK_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    start = time.monotonic()
    with pytest.raises(hpcring.spark.SparkJobFailed, match=r"rank 1 \(Spark task \d") as failed:
        hpcring.spark.run(spark_programs.raise_on, args=(1,), num_proc=2, env={name: value})
    print(f"failure reported after {time.monotonic() - start:.1f} s")
    assert failed.value.rank == 1
    assert "ValueError: boom from rank 1" in str(failed.value)
    assert "raise_on" in str(failed.value)  # the worker's traceback
    deadline = time.monotonic() + 20
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with(marker) == []
    # The cluster serves the next job.
    assert hpcring.spark.run(spark_programs.scaled, args=(1,), num_proc=2) == [
        {"rank": r, "value": r} for r in range(2)
    ]


def test_a_worker_that_dies_is_named(spark: Any) -> None:
    import hpcring.spark

    with pytest.raises(hpcring.spark.SparkJobFailed, match=r"rank 1 \(Spark task \d") as failed:
        hpcring.spark.run(spark_programs.exit_on, args=(1,), num_proc=2)
    assert "the worker process ended" in str(failed.value)


def test_more_processes_than_task_slots_is_refused(spark: Any) -> None:
    import hpcring.spark

    slots = spark.sparkContext.defaultParallelism
    with pytest.raises(ConfigError, match=rf"num_proc={slots + 1} is more than the {slots} task slots"):
        hpcring.spark.run(spark_programs.scaled, args=(1,), num_proc=slots + 1)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("use_gloo", True),
        ("use_mpi", False),
        ("extra_mpi_args", "-x A"),
        ("nics", ["eth0"]),
        ("executable", "py"),
        ("stdout", io.StringIO()),
        ("stderr", io.StringIO()),
        ("prefix_output_with_timestamp", "yes"),
    ],
)
def test_horovod_parameters_without_meaning_are_refused(name: str, value: Any) -> None:
    import hpcring.spark

    with pytest.raises(ConfigError, match=rf"(run\({name}=|{name} must be True or False)"):
        hpcring.spark.run(spark_programs.scaled, args=(1,), num_proc=2, **{name: value})


def test_ranks_group_tasks_by_host() -> None:
    assert ranks_by_host(["a", "b", "a", "b"]) == [0, 2, 1, 3]
    assert ranks_by_host(["b", "a", "a"]) == [0, 1, 2]
    assert ranks_by_host(["h"] * 3) == [0, 1, 2]
