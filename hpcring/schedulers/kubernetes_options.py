"""`site.kubernetes` of a profile into KubernetesOptions, with the checks a schema cannot make: the site's MPI
must be one the MPI Operator runs, and `site.container` (Apptainer around each rank) does not apply, because
every rank already runs in the pod's own image."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcring.errors import ProfileError, choices
from hpcring.schedulers.model import KubernetesOptions

# site.mpi -> the MPIJob's `mpiImplementation` (the values the v2beta1 CRD allows).
MPI_IMPLEMENTATIONS: dict[str, str] = {"openmpi": "OpenMPI", "intel-mpi": "Intel", "mpich": "MPICH"}


def parse(site: Mapping[str, Any], where: str) -> KubernetesOptions:
    """KubernetesOptions from a schema-valid `site` mapping (defaults when the scheduler is another)."""
    if site["scheduler"] != "kubernetes":
        return KubernetesOptions()
    mpi = site.get("mpi", "openmpi")
    if mpi not in MPI_IMPLEMENTATIONS:
        raise ProfileError(
            f"{where}: site.mpi: {mpi!r} is not an MPI the MPI Operator runs; allowed with kubernetes: "
            f"{choices(MPI_IMPLEMENTATIONS)}"
        )
    if site.get("container"):
        raise ProfileError(
            f"{where}: site.container: not used with kubernetes (every rank runs in the pod's image); "
            "remove it and give the image as site.kubernetes.image or --image"
        )
    d = site.get("kubernetes") or {}
    return KubernetesOptions(
        namespace=d.get("namespace"),
        image=d.get("image"),
        gpu_resource=d.get("gpu_resource"),
        rdma_resources=tuple((k, int(v)) for k, v in (d.get("rdma_resources") or {}).items()),
        shm_size=d.get("shm_size"),
        capabilities=tuple(d.get("capabilities", [])),
        worker_memory=d.get("worker_memory"),
        # The operator compares the path with "/root/.ssh" exactly (the keys' 0600 mode depends on it).
        ssh_auth_mount_path=d.get("ssh_auth_mount_path", "/root/.ssh").rstrip("/") or "/",
        clean_pod_policy=d.get("clean_pod_policy", "Running"),
        backoff_limit=d.get("backoff_limit"),
        ttl_seconds_after_finished=d.get("ttl_seconds_after_finished"),
        node_selector=tuple((k, str(v)) for k, v in (d.get("node_selector") or {}).items()),
        service_account=d.get("service_account"),
        image_pull_secrets=tuple(d.get("image_pull_secrets", [])),
    )
