"""One real local Spark cluster for the whole tests/spark run: `local-cluster[2,2,1024]` (two worker JVMs, two
cores each). Its start (about a minute on a loaded 2-core machine) is paid once, not per module.

The tasks' workers need MPICH (docs/guide/spark.md); this repository's main environment holds the Open MPI
wheel, so the executors borrow the MPICH environment as tests/ray's actors do. Skips when pyspark or Java is
missing (`make setup` installs the `spark` extra; CI installs a Java 17 runtime).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "ray"))


def _wait_for_executors(sc: Any, slots: int, timeout: float) -> None:
    """Wait until both worker JVMs' executors registered (after the session starts): 4 slots."""
    deadline = time.monotonic() + timeout
    while sc.defaultParallelism < slots:
        if time.monotonic() > deadline:
            pytest.fail(
                f"the local cluster has {sc.defaultParallelism} task slots after {timeout:g} s, not {slots}"
            )
        time.sleep(0.5)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SparkSession on local-cluster[2,2,1024], stopped at the end of the run. A test that kills an
    executor waits for the cluster to have its four slots again before it returns."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hpcring[spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (Spark 4 needs Java 17: apt-get install openjdk-17-jre-headless)")
    from pyspark.sql import SparkSession
    from ray_support import mpich_env

    env = {
        **mpich_env(),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local-cluster[2,2,1024]")
        .appName("hpcring-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark")))
        .config("spark.python.worker.reuse", "true")
    )
    for name, value in env.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _wait_for_executors(session.sparkContext, slots=4, timeout=120)
    try:
        yield session
    finally:
        session.stop()
