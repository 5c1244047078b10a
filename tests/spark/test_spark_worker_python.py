"""Which Python Spark's executors run for hpcring, and the one-line refusals when it cannot run hpcring's
workers, on the real local Spark cluster of conftest (docs/guide/spark.md, "Which Python the executors run").

Without PYSPARK_PYTHON or spark.pyspark.python, the executors run the driver's Python. A Python that cannot
import hpcring, or whose mpi4py loads Open MPI, is refused on the driver before any Spark job starts; a task
whose executor Python cannot import hpcring (where the driver could not ask it) fails with one line naming
that Python and the fix. The Pythons without hpcring or MPICH are wrappers around real interpreters: this
environment's Python with the MPICH variables removed, and the base interpreter (`sys.base_prefix`) with the
checkout removed from PYTHONPATH.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import spark_programs

from hpcring.errors import ConfigError
from hpcring.spark import executors
from hpcring.spark.stage import SparkStage

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def python_exec(spark: Any) -> Iterator[Any]:
    """The context, its executors' Python restored after the test (the session's other tests need it)."""
    sc = spark.sparkContext
    saved = sc.pythonExec
    try:
        yield sc
    finally:
        sc.pythonExec = saved


def _wrapper(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _no_jobs_in(sc: Any, group: str) -> bool:
    return list(sc.statusTracker().getJobIdsForGroup(group)) == []


def test_executors_run_the_drivers_python_when_nothing_says_otherwise(
    python_exec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpcring.spark

    sc = python_exec
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert sc.getConf().get("spark.pyspark.python", None) is None
    sc.pythonExec = executors.PYSPARK_DEFAULT  # as a context created without PYSPARK_PYTHON has it
    assert hpcring.spark.run(spark_programs.executable, num_proc=2) == [(r, sys.executable) for r in range(2)]
    assert sc.pythonExec == sys.executable


def test_an_open_mpi_worker_python_is_refused_before_any_job(python_exec: Any, tmp_path: Path) -> None:
    import hpcring.spark

    sc = python_exec
    unset = "unset MPI4PY_MPIABI LD_LIBRARY_PATH HPCRING_RAY_MPIEXEC"
    sc.pythonExec = _wrapper(tmp_path, "openmpi-python", f'{unset}\nexec {sys.executable} "$@"')
    group = f"refused-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "must stay empty")
    with pytest.raises(ConfigError) as refused:
        hpcring.spark.run(spark_programs.executable, num_proc=2)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("hpcring.spark.run needs MPICH in its workers")
    assert f"the workers' Python {sc.pythonExec} (SparkContext.pythonExec)" in message
    assert "Open MPI" in message and "mpich extra" in message
    assert _no_jobs_in(sc, group)


def _without_checkout(tmp_path: Path) -> str:
    """A wrapper that runs the base interpreter with this checkout taken off PYTHONPATH: pyspark (from
    Spark's own path) but no hpcring."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    if not base.exists():
        pytest.skip(f"no base interpreter at {base}")
    drop = f"{ROOT}"
    body = (
        f'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -vx "{drop}" | paste -sd : -)\n'
        f'export PYTHONPATH\nexec {base} "$@"'
    )
    return _wrapper(tmp_path, "python-without-hpcring", body)


def test_a_worker_python_without_hpcring_is_refused_before_any_job(python_exec: Any, tmp_path: Path) -> None:
    import hpcring.spark

    sc = python_exec
    sc.pythonExec = _without_checkout(tmp_path)
    group = f"refused-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "must stay empty")
    with pytest.raises(ConfigError) as refused:
        hpcring.spark.run(spark_programs.executable, num_proc=2)
    message = str(refused.value)
    assert "\n" not in message
    assert f"the workers' Python {sc.pythonExec}" in message
    assert "cannot import hpcring's worker code" in message and "No module named 'hpcring'" in message
    assert "PYSPARK_PYTHON" in message
    assert _no_jobs_in(sc, group)


def test_a_task_whose_python_lacks_hpcring_fails_in_one_line(python_exec: Any, tmp_path: Path) -> None:
    """Past the driver's check (a stage run directly): the executor's Python names itself and the fix."""
    sc = python_exec
    sc.pythonExec = _without_checkout(tmp_path)
    stage = SparkStage(sc, "run")
    try:
        job = stage.job(2, "world/1", 60.0, {})
        with pytest.raises(ConfigError) as refused:
            stage.run(job, b"never unpickled")
    finally:
        stage.close()
    message = str(refused.value)
    assert "\n" not in message and refused.value.__cause__ is None
    base = Path(sys.base_prefix) / "bin" / "python3"  # what the wrapper runs: the worker's sys.executable
    assert message.startswith(f"hpcring.spark: the Spark executors' Python {base} cannot import")
    assert "No module named 'hpcring'" in message and "PYSPARK_PYTHON" in message
