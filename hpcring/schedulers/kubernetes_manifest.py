"""The MPIJob manifest: an MpiJobPlan formatted as a Kubernetes object and dumped by PyYAML's safe dumper.

Every value is data in a mapping, never text pasted into a template, so no string can add a field or a
document. One rule of Kubernetes itself needs care: the kubelet expands `$(NAME)` in a container's command,
args and env values, and `$$` is its escape; every `$` hpcring writes there is doubled, so the rank sees each
string exactly as given.
"""

from __future__ import annotations

from typing import Any

import yaml

from hpcring.schedulers.kubernetes_batch import API_VERSION, KIND
from hpcring.schedulers.kubernetes_plan import MpiJobPlan

SHM_VOLUME = "dshm"
LAUNCHER_CONTAINER = "mpi-launcher"
WORKER_CONTAINER = "mpi-worker"
# The launcher runs only mpirun (ranks run on workers): a small fixed share, given so that namespaces whose
# ResourceQuota wants requests admit the pod, and as limits so that it runs as Guaranteed.
LAUNCHER_RESOURCES = {"cpu": "1", "memory": "2Gi"}


def kube_escape(text: str) -> str:
    """`text` as the kubelet must read it to leave it unchanged: each `$` doubled (`$$` expands to `$`)."""
    return text.replace("$", "$$")


def _container(plan: MpiJobPlan, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": plan.image}
    if plan.workdir:
        c["workingDir"] = plan.workdir
    if plan.capabilities:
        c["securityContext"] = {"capabilities": {"add": list(plan.capabilities)}}
    return c


def _pod_spec(plan: MpiJobPlan, container: dict[str, Any], worker: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container]}
    if plan.service_account:
        spec["serviceAccountName"] = plan.service_account
    if plan.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in plan.image_pull_secrets]
    if worker:
        if plan.node_selector:
            spec["nodeSelector"] = dict(plan.node_selector)
        shm: dict[str, Any] = {"medium": "Memory"}
        if plan.shm_size:
            shm["sizeLimit"] = plan.shm_size
        spec["volumes"] = [{"name": SHM_VOLUME, "emptyDir": shm}]
    return spec


def to_object(plan: MpiJobPlan) -> dict[str, Any]:
    """The MPIJob as a mapping (what the CRD schema validates and the dumper writes)."""
    launcher = _container(plan, LAUNCHER_CONTAINER)
    launcher["command"] = [kube_escape(w) for w in plan.launcher_command]
    launcher["env"] = [{"name": k, "value": kube_escape(v)} for k, v in plan.env]
    launcher["resources"] = {"requests": dict(LAUNCHER_RESOURCES), "limits": dict(LAUNCHER_RESOURCES)}
    # No worker command: the operator then runs `/usr/sbin/sshd -De` itself (docs/dev/kubernetes.md).
    worker = _container(plan, WORKER_CONTAINER)
    requests: dict[str, Any] = dict(plan.worker_requests)
    worker["resources"] = {"requests": requests, "limits": {**requests, **dict(plan.worker_resources)}}
    worker["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if plan.ssh_port is not None:
        # Ready once sshd accepts connections: what the launcher waits for (launcherCreationPolicy).
        worker["readinessProbe"] = {"tcpSocket": {"port": plan.ssh_port}, "periodSeconds": 2}
    metadata: dict[str, Any] = {"name": plan.name}
    if plan.namespace:
        metadata["namespace"] = plan.namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "hpcring"}
    metadata["annotations"] = {
        "hpcring/version": plan.version,
        "hpcring/profile": plan.profile,
        "hpcring/profile-sha256": plan.digest,
    }
    run_policy: dict[str, Any] = {"cleanPodPolicy": plan.clean_pod_policy}
    if plan.backoff_limit is not None:
        run_policy["backoffLimit"] = plan.backoff_limit
    if plan.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = plan.ttl_seconds_after_finished
    if plan.active_deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = plan.active_deadline_s
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": plan.slots_per_worker,
            "mpiImplementation": plan.mpi_implementation,
            "sshAuthMountPath": plan.ssh_auth_mount_path,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {"spec": _pod_spec(plan, launcher, worker=False)},
                },
                "Worker": {
                    "replicas": plan.workers,
                    "template": {"spec": _pod_spec(plan, worker, worker=True)},
                },
            },
        },
    }


class _Dumper(yaml.SafeDumper):
    """The safe dumper, writing multi-line strings (the GPU wrapper) as literal blocks where YAML can."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(obj: dict[str, Any]) -> str:
    """YAML text of a manifest object; loading it back with yaml.safe_load gives `obj` again."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100_000)


def render(plan: MpiJobPlan) -> str:
    """The manifest's text: a provenance comment (our own numbers only), then the object."""
    header = (
        f"# hpcring {plan.version}: MPIJob for the Kubeflow MPI Operator. {plan.summary}.\n"
        f"# Checked against the MPIJob CRD's OpenAPI schema ({API_VERSION}). Submit: kubectl apply -f FILE\n"
    )
    return header + dump(to_object(plan))
