"""A real local Ray cluster for tests/ray (small: few CPUs, a small object store), shut down after the module.

The workers need MPICH (docs/guide/ray.md). This repository's main environment holds the Open MPI wheel, so
the actors borrow the MPICH environment's library and `mpiexec` (mpi4py's wheels load either ABI:
MPI4PY_MPIABI=mpich with MPICH's lib directory on LD_LIBRARY_PATH). An environment installed with
'hpcring[mpich,ray]' needs none of this.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from ray_support import HERE, ROOT, mpich_env


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """ray.init() on this machine with 3 CPUs; the test programs importable by the actors and workers."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'hpcring[ray]')")
    env = {
        **mpich_env(),
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
