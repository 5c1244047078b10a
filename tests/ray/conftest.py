"""A real local Ray cluster for tests/ray (small: few CPUs, a small object store), shut down after the module.

The workers need MPICH (docs/ray.md). This repository's main environment holds the Open MPI wheel, so the
actors borrow the MPICH environment's library and `mpiexec` (mpi4py's wheels load either ABI:
MPI4PY_MPIABI=mpich with MPICH's lib directory on LD_LIBRARY_PATH). An environment installed with
'hpcring[mpich,ray]' needs none of this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'hpcring[ray]')")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _mpich_env() -> dict[str, str]:
    """Variables that make this interpreter's workers use MPICH; {} when it already does."""
    probe = "from mpi4py import MPI; print('MPICH' in MPI.Get_library_version())"
    uses_mpich = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if uses_mpich == "True":
        return {}
    py = Path(os.environ.get("HPCRING_TEST_MPICH_PYTHON") or ROOT / ".venv-mpich" / "bin" / "python")
    prefix = py.parent.parent
    if not (prefix / "bin" / "mpiexec").exists():
        pytest.skip(f"MPICH environment not found at {prefix} (run `make setup`)")
    return {
        "MPI4PY_MPIABI": "mpich",
        "LD_LIBRARY_PATH": str(prefix / "lib"),
        "HPCRING_RAY_MPIEXEC": str(prefix / "bin" / "mpiexec"),
    }


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """ray.init() on this machine with 3 CPUs; the test programs importable by the actors and workers."""
    env = {
        **_mpich_env(),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    ray.init(
        num_cpus=3,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        runtime_env={"env_vars": env},
        log_to_driver=True,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
