"""Helpers for the Kubernetes tests: MPIJob plans from the built-in profile (or a variant of it), and the
kubelet's `$(VAR)` expansion (tests/kubelet.py) to read a manifest as a pod would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpcring.schedulers import kubernetes_manifest, kubernetes_plan, mapping, profile
from hpcring.schedulers.job import JobSpec, Step
from hpcring.schedulers.model import Profile

PROFILE = "generic-k8s-gpu"


def variant(mpi: str = "openmpi", binding: bool = True, extra: str = "") -> Profile:
    """The built-in profile with another site.mpi / binding, and `extra` YAML lines appended to
    site.kubernetes."""
    text = profile.source_of(PROFILE)[1]
    text = text.replace("  mpi: openmpi\n", f"  mpi: {mpi}\n").replace(
        "  binding: true\n", f"  binding: {'true' if binding else 'false'}\n"
    )
    return profile.parse(text + extra, "variant")


def plan(prof: Profile | None = None, **job: Any) -> kubernetes_plan.MpiJobPlan:
    command = job.pop("command", ("python", "train.py"))
    job.setdefault("image", "registry.example/train:1")
    spec = JobSpec(steps=(Step(tuple(command)),), **job) if "steps" not in job else JobSpec(**job)
    p = prof or profile.load(PROFILE)
    return kubernetes_plan.build(mapping.build(p, spec), spec)


def manifest(p: kubernetes_plan.MpiJobPlan) -> dict[str, Any]:
    """The rendered text, loaded back (it must be one YAML document)."""
    docs = list(yaml.safe_load_all(kubernetes_manifest.render(p)))
    assert len(docs) == 1
    obj: dict[str, Any] = docs[0]
    return obj


def containers(obj: dict[str, Any], role: str) -> list[dict[str, Any]]:
    spec = obj["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    found: list[dict[str, Any]] = spec["containers"]
    return found


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path
