"""The README's install runs every feature: from an environment installed with the mpich and spark extras
(the MPICH environment of `make setup`), `hpcring.spark.run` trains on a plain local Spark session with no
variable set and the environment not activated: its executors run the driver's Python and form an MPICH world.

Its own Spark (`local[2]`, one JVM) in a subprocess, since the driver must be that environment's Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MPICH_PY = Path(os.environ.get("HPCRING_TEST_MPICH_PYTHON") or ROOT / ".venv-mpich" / "bin" / "python")
# What tests/spark's own session sets to borrow MPICH: none of it here.
BORROWED = (
    "MPI4PY_MPIABI",
    "LD_LIBRARY_PATH",
    "HPCRING_RAY_MPIEXEC",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
)


def _has(python: Path, module: str) -> bool:
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=120, check=False)
    return probe.returncode == 0


@pytest.mark.timeout(420)
def test_an_mpich_environment_runs_hpcring_spark_as_installed(tmp_path: Path) -> None:
    if not MPICH_PY.exists() or not _has(MPICH_PY, "pyspark"):
        pytest.skip(f"{MPICH_PY} has no pyspark (make setup installs the spark extra there)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (Spark 4 needs Java 17)")
    env = {k: v for k, v in os.environ.items() if k not in BORROWED and not k.startswith("HPCRING_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's hpcring, in the driver and (inherited) in the executors
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if Path(p) != MPICH_PY.parent)  # not activated
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [MPICH_PY, HERE / "mpich_env_program.py", "2", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [tuple(r) for r in results] == [(r, 2, 3.0, str(MPICH_PY), True) for r in range(2)]
