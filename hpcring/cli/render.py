"""`hpcring render`: print (or write with -o) the Slurm/LSF/PBS/Flux job script, or the Kubernetes MPIJob
manifest, for a profile and a job."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    from hpcring.cli import job_flags
    from hpcring.cli.flag_values import env

    job_flags.add_shape_args(parser)
    job_flags.add_script_args(parser)
    parser.add_argument("-o", "--out", default=env("HPCRING_OUT"), help="write the script here [HPCRING_OUT]")


def write_script(text: str, files: list[tuple[str, str]], path: Path) -> None:
    """Write the script (executable) and its extra files next to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for file_path, content in files:
        Path(file_path).write_text(content, "utf-8")
    path.write_text(text, "utf-8")
    path.chmod(0o755)


def prepare(args: argparse.Namespace, out: Path | None) -> tuple[object, str]:
    """(plan, script text) for the parsed flags; extra files go next to `out` unless --inline-files."""
    from hpcring.cli import job_flags
    from hpcring.schedulers import jobscript, mapping, plan, planner

    prof = job_flags.load_profile(args)
    job = job_flags.job_from_args(args)
    rm = mapping.build(prof, job)
    if prof.site.scheduler == "kubernetes":  # an MPIJob manifest, not a batch script
        from hpcring.cli import kubernetes

        return kubernetes.prepare(args, rm, job)
    if out is not None and not args.inline_files:
        opts = plan.RenderOptions(files_dir=str(out.resolve().parent), basename=out.stem)
    else:
        opts = plan.RenderOptions()
    from hpcring.launch.elastic import batch
    from hpcring.schedulers import requeue

    p = batch.apply(planner.build(rm, job, opts, launcher_name=args.launcher), job)
    p = requeue.apply(p, job, rm.shape.time_s, str(out.resolve()) if out is not None else None)
    return p, jobscript.render(p)


def main(args: argparse.Namespace) -> int:
    from hpcring.schedulers.plan import Plan

    out = Path(args.out) if args.out else None
    p, text = prepare(args, out)
    if out is None:
        print(text, end="")
        return 0
    if not isinstance(p, Plan):  # a Kubernetes manifest: one file, nothing next to it
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, "utf-8")
        print(f"wrote {out}")
        return 0
    write_script(text, [(f.path, f.content) for f in p.files if f.path], out)
    print(f"wrote {out}" + "".join(f" and {f.path}" for f in p.files if f.path))
    return 0
