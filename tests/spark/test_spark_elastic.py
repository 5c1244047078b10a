"""`hpcring.spark.run_elastic` on the real local cluster: an elastic torch training survives a killed executor
JVM (the world re-forms from the slots left and resumes from the last commit), a function's exception is
named, reset_limit ends a run that keeps losing workers, and bad bounds are refused naming the field."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import spark_programs
from spark_kill import Killer, nothing_left, wait_for_slots

from hpcring.errors import ConfigError

pytestmark = pytest.mark.timeout(420)

EPOCHS = 12


def _expected_weights(epochs: int) -> Any:
    """The same full-batch training in this process, without Spark or a kill."""
    import torch

    model = spark_programs.regression_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = spark_programs.regression_data()
    for _ in range(epochs):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("executor", [True, False], ids=["executor", "python-worker"])
def test_training_survives_a_lost_task(spark: Any, tmp_path: Path, capsys: Any, executor: bool) -> None:
    """Rank 1's executor JVM (or only its task's Python worker) is killed after 3 committed epochs."""
    import torch

    import hpcring.spark

    marker = f"HPCRING_SPARK_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    killer = Killer(tmp_path, 4, rank=1, executor=executor, committed=3)
    killer.start()
    called = time.time()
    try:
        results = hpcring.spark.run_elastic(
            spark_programs.elastic_regression,
            args=(str(tmp_path), EPOCHS, 0.5),
            num_proc=4,
            min_np=2,
            start_timeout=120,
            elastic_timeout=120,
            env={name: value},
        )
        done = time.monotonic()
        killer.join()
        out = capsys.readouterr().out
        final = results[0]
        size = len(results)
        starts = final["starts"]
        what = "executor" if executor else "Python worker"
        with capsys.disabled():
            print(
                f"\n{out}world starts (generation, size, epoch, time): {starts}\nfirst world running fn "
                f"{starts[0][3] - called:.1f} s after the call; {what} killed → re-formed world running "
                f"fn after {starts[-1][3] - killer.wall_clock_at:.1f} s, completed after "
                f"{done - killer.at:.1f} s"
            )
        # A lost executor leaves 2 slots until its replacement registers; a lost Python worker none.
        assert (2 <= size <= 4) if executor else (size == 4)
        # Every rank holds the same state (the start times are each rank's own clock).
        assert all(r["weights"] == final["weights"] for r in results)
        assert all(r["epochs_seen"] == final["epochs_seen"] for r in results)
        assert all([s[:3] for s in r["starts"]] == [s[:3] for s in starts] for r in results)
        assert starts[0][:3] == (0, 4, 0)
        assert len(starts) >= 2  # re-formed at least once
        generation, world, first_epoch, _ = starts[-1]
        assert generation >= 1 and world == size
        assert first_epoch >= killer.committed  # resumed from a commit, not from epoch 0
        # Every epoch trained exactly once in the committed history, at the size of its world.
        assert [e for e, _ in final["epochs_seen"]] == list(range(EPOCHS))
        assert {s for _, s in final["epochs_seen"][first_epoch:]} == {size}
        torch.testing.assert_close(torch.tensor(final["weights"]), _expected_weights(EPOCHS))
        assert "re-forming with" in out
        nothing_left(marker)
    finally:
        print(f"4 task slots again after {wait_for_slots(spark.sparkContext, 4, 180):.1f} s")


def test_an_exception_of_the_function_is_named(spark: Any) -> None:
    import hpcring.spark

    with pytest.raises(hpcring.spark.SparkJobFailed, match=r"rank 1 \(Spark task \d") as failed:
        hpcring.spark.run_elastic(spark_programs.raise_on, args=(1,), num_proc=2, min_np=1)
    assert failed.value.rank == 1
    assert "ValueError: boom from rank 1" in str(failed.value)


def test_reset_limit_ends_a_run_that_keeps_losing_workers(spark: Any, capsys: Any) -> None:
    import hpcring.spark

    with pytest.raises(hpcring.spark.SparkJobFailed, match=r"reset_limit=1 reached") as failed:
        hpcring.spark.run_elastic(spark_programs.exit_on, args=(1,), num_proc=2, reset_limit=1)
    assert "the worker process ended" in str(failed.value)
    assert capsys.readouterr().out.count("re-forming with 2 ranks") == 1  # two worlds ran


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"num_proc": 2, "min_np": 3}, r"min_np=3 is more than num_proc=2"),
        ({"num_proc": 2, "max_np": 1}, r"max_np=1 is less than num_proc=2"),
        ({"num_proc": 2, "min_np": 0}, r"min_np must be a positive integer, got 0"),
        ({"num_proc": 0}, r"num_proc must be a positive integer, got 0"),
        ({"num_proc": 2, "reset_limit": -1}, r"reset_limit must be an integer >= 0"),
        ({"num_proc": 2, "elastic_timeout": 0}, r"elastic_timeout must be a positive number"),
        ({"num_proc": 2, "nics": ["eth0"]}, r"run_elastic\(nics="),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(spark: Any, given: dict[str, Any], message: str) -> None:
    import hpcring.spark

    with pytest.raises(ConfigError, match=message):
        hpcring.spark.run_elastic(spark_programs.scaled, args=(1,), **given)
