"""`hpcring render` and `hpcring submit` for profiles whose scheduler is `kubernetes`: an MPIJob manifest
(Kubeflow MPI Operator), validated against the MPIJob CRD's schema, applied with kubectl."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from hpcring.errors import ConfigError


def prepare(args: argparse.Namespace, rm: Any, job: Any) -> tuple[Any, str]:
    """(plan, manifest text), the manifest checked against the CRD's schema before anyone sees it."""
    from hpcring.schedulers import kubernetes_crd, kubernetes_manifest, kubernetes_plan

    if getattr(args, "launcher", None) not in (None, "mpirun"):
        raise ConfigError(
            f"--launcher {args.launcher!r} cannot start ranks under kubernetes; allowed: 'mpirun'"
        )
    plan = kubernetes_plan.build(rm, job)
    kubernetes_crd.validate(kubernetes_manifest.to_object(plan))
    return plan, kubernetes_manifest.render(plan)


def write(text: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, "utf-8")


def submit(args: argparse.Namespace, path: Path) -> int:
    """Render, check kubectl and its context, write the manifest, `kubectl apply -f` it, maybe wait."""
    from hpcring.cli import job_flags, progress
    from hpcring.schedulers import kubernetes_jobs, mapping

    prof = job_flags.load_profile(args)
    job = job_flags.job_from_args(args)
    plan, text = prepare(args, mapping.build(prof, job), job)
    if args.dry_run:
        print(f"# manifest: {path} {job_flags.NOT_WRITTEN}")
        print(text, end="")
        print(f"# would run: {shlex.join(kubernetes_jobs.apply_argv('kubectl', str(path)))}")
        return 0
    kubectl = kubernetes_jobs.kubectl_path()
    kubernetes_jobs.current_context(kubectl)
    write(text, path)
    kubernetes_jobs.apply(kubernetes_jobs.apply_argv(kubectl, str(path)))
    print(plan.name, flush=True)
    if not args.wait:
        return 0
    get = kubernetes_jobs.get_argv(kubectl, plan.name, plan.namespace)
    on_change = progress.state_printer(sys.stderr, args.quiet)
    result = kubernetes_jobs.wait(
        get, plan.name, poll=args.poll, timeout=args.wait_timeout, on_change=on_change
    )
    print(
        f"hpcring submit: MPIJob {plan.name} ended: {result.state}, exit code {result.exit_code}",
        file=sys.stderr,
    )
    return result.exit_code
