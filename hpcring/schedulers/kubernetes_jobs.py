"""kubectl for MPIJobs: the checks before submitting (kubectl on PATH, a current context), the apply and get
command lines, and the job's end read from the MPIJob's status conditions."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping

from hpcring.errors import ConfigError, SubmitError
from hpcring.schedulers.jobstate import Active, JobResult, OnChange, poll_until_end, run

# MPIJob conditions (kubeflow.org/v2beta1 JobConditionType) that end a job.
ENDED = ("Succeeded", "Failed")
# The conditions of a job that has not ended, by phase; the latest true one wins (Created: not yet running).
PHASES = {"Created": "pending", "Running": "running", "Restarting": "pending", "Suspended": "suspended"}


def kubectl_path(env: Mapping[str, str] | None = None) -> str:
    """kubectl's path, or a ConfigError saying how to go on without it."""
    path = shutil.which("kubectl", path=(os.environ if env is None else env).get("PATH", ""))
    if path is None:
        raise ConfigError(
            "kubectl not found on PATH: install it and configure access to your cluster, or write the "
            "manifest with `hpcring render -o job.yaml` and apply it from a machine that has kubectl"
        )
    return path


def current_context(kubectl: str) -> str:
    """kubectl's current context, or a ConfigError when there is none (nothing to submit to)."""
    res = run([kubectl, "config", "current-context"], timeout=30)
    name = res.stdout.strip()
    if res.returncode != 0 or not name:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"kubectl has no current context ({why}): choose a cluster with `kubectl config use-context NAME`"
        )
    return name


def apply_argv(kubectl: str, manifest: str) -> list[str]:
    """The submit command; the namespace, when the profile sets one, is in the manifest."""
    return [kubectl, "apply", "-f", manifest]


def get_argv(kubectl: str, name: str, namespace: str | None) -> list[str]:
    ns = ["--namespace", namespace] if namespace else []
    return [kubectl, "get", "mpijob", name, *ns, "--output", "json"]


def apply(argv: list[str]) -> None:
    res = run(argv)
    if res.returncode != 0:
        why = res.stderr.strip() or res.stdout.strip()
        raise SubmitError(f"kubectl apply refused the MPIJob (exit {res.returncode}): {why}")


def state(name: str, text: str) -> JobResult | Active:
    """The job's result once a Succeeded or Failed condition is true; before, its latest true condition.

    An MPIJob's status holds no exit code: a failed job reports 1 and its condition's reason.
    """
    try:
        status = json.loads(text).get("status") or {}
    except (json.JSONDecodeError, AttributeError) as exc:
        raise SubmitError(f"kubectl get mpijob {name} printed no JSON object: {text[:200]!r}") from exc
    latest = "Created"
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ENDED:
            ok = cond["type"] == "Succeeded"
            reason = cond.get("reason") or cond["type"]
            return JobResult(name, f"{cond['type']} ({reason})", 0 if ok else 1)
        if cond.get("type") in PHASES:
            latest = cond["type"]
    return Active(latest, PHASES[latest])


def wait(
    argv: list[str], name: str, poll: float, timeout: float | None, on_change: OnChange | None = None
) -> JobResult:
    """Poll `kubectl get mpijob` until the job ends."""

    def query() -> JobResult | Active:
        res = run(argv)
        if res.returncode != 0:
            raise SubmitError(
                f"kubectl get mpijob {name} failed (exit {res.returncode}): {res.stderr.strip()}"
            )
        return state(name, res.stdout)

    return poll_until_end(query, f"MPIJob {name}", poll, timeout, on_change)
