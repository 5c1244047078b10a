"""Kubernetes through the Kubeflow MPI Operator: the scheduler entry of the registry.

There is no batch script: `kubernetes_plan` computes an MPIJob plan and `kubernetes_manifest` formats it. This
class answers the questions the registry and the profile checks ask of every scheduler; a job's first worker
(MASTER_ADDR) is named per job by `kubernetes_plan.first_worker`.
"""

from __future__ import annotations

from hpcring.schedulers.interfaces import Scheduler
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.plan import Directive
from hpcring.schedulers.shell import Raw

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"


class Kubernetes(Scheduler):
    name = "kubernetes"
    directive_prefix = ""  # the manifest's fields take the place of directives
    template = ""  # formatted by kubernetes_manifest, not by a Jinja template
    job_id_var = ""

    def directives(self, rm: RankMap, job: JobSpec, account: str | None) -> list[Directive]:
        return []

    def master_addr(self, rm: RankMap) -> Raw:
        # Replaced per job (the first worker's DNS name needs the job's name); never a shell expression.
        return Raw("")

    def submit_argv(self) -> list[str]:
        return ["kubectl", "apply", "-f"]
