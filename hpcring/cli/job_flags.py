"""The job flags of `hpcring map`, `render` and `submit`, and the JobSpec they give.

Flags override the job file (`--job FILE`), which overrides the profile's defaults; a flag's environment
variable stands in for it when it is not given, so a site can set e.g. HPCRING_ACCOUNT once in a login script.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hpcring.cli.flag_values import env, env_flag, env_list
from hpcring.errors import ConfigError
from hpcring.schedulers import job as jobmod
from hpcring.schedulers import profile as profmod
from hpcring.schedulers import requeue
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.model import LAUNCHERS, Profile


def _count(text: str) -> int | str:
    """argparse type for a count: the integer when the text is one (negative too), else the text itself.

    Ranges and types are not checked here: `job_from_args` hands every flag to `job.check`, the validation job
    files go through, so `--cpus-per-rank 0` and `cpus_per_rank: 0` are refused by the same rule.
    """
    try:
        return int(text)
    except ValueError:
        return text


# --dry-run has no side effect, so the path it shows is where the script *would* go; saying so keeps a user
# from looking for it (`hpcring render -o PATH` writes it).
NOT_WRITTEN = "(not written: --dry-run writes and submits nothing; hpcring render -o PATH writes it)"

# Job-file key -> (flag, environment variable): what an error about a flag's value names.
FLAG_OF: dict[str, tuple[str, str]] = {
    "nodes": ("--nodes", "HPCRING_NODES"),
    "ranks_per_node": ("--ranks-per-node", "HPCRING_RANKS_PER_NODE"),
    "ranks": ("--ranks", "HPCRING_RANKS"),
    "gpus_per_rank": ("--gpus-per-rank", "HPCRING_GPUS_PER_RANK"),
    "cpus_per_rank": ("--cpus-per-rank", "HPCRING_CPUS_PER_RANK"),
    "threads_per_core": ("--threads-per-core", "HPCRING_THREADS_PER_CORE"),
    "time": ("--time", "HPCRING_TIME"),
    "partition": ("--partition", "HPCRING_PARTITION"),
    "name": ("--job-name", "HPCRING_JOB_NAME"),
    "account": ("--account", "HPCRING_ACCOUNT"),
    "output": ("--job-output", "HPCRING_JOB_OUTPUT"),
    "error": ("--job-error", "HPCRING_JOB_ERROR"),
    "workdir": ("--workdir", "HPCRING_WORKDIR"),
    "image": ("--image", "HPCRING_IMAGE"),
    "binds": ("--bind", "HPCRING_BINDS"),
    "modules": ("--module", "HPCRING_MODULES"),
    "steps": ("--step", "HPCRING_STEPS"),
    "requeue": ("--requeue-on-limit", "HPCRING_REQUEUE_ON_LIMIT"),
}


def flag_label(path: str) -> str:
    """The flag (and its variable) behind a job-file path: `steps[1].run` -> `--step [HPCRING_STEPS]`."""
    key = path.split(".")[0].split("[")[0]
    if key not in FLAG_OF:
        return path
    flag, var = FLAG_OF[key]
    return f"{flag} [{var}]"


def add_profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        default=env("HPCRING_PROFILE"),
        help="profile name (built-in or in HPCRING_PROFILE_PATH), YAML file, or 'local' [HPCRING_PROFILE]",
    )


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """Flags that shape the mapping (used by map, render and submit)."""
    add_profile_args(p)
    g = p.add_argument_group("job shape")
    g.add_argument(
        "--job",
        default=env("HPCRING_JOB"),
        help="YAML job file with any of these settings; flags win over it [HPCRING_JOB]",
    )
    for flag, var, text in (
        ("--nodes", "HPCRING_NODES", "number of nodes the job asks for; default 1"),
        ("--ranks-per-node", "HPCRING_RANKS_PER_NODE", "ranks per node (default: one per GPU)"),
        ("--ranks", "HPCRING_RANKS", "total ranks (alternative to --ranks-per-node)"),
        ("--gpus-per-rank", "HPCRING_GPUS_PER_RANK", "GPUs per rank (default 1 on GPU nodes)"),
        (
            "--cpus-per-rank",
            "HPCRING_CPUS_PER_RANK",
            "physical cores per rank (default: even share of the closest)",
        ),
        (
            "--threads-per-core",
            "HPCRING_THREADS_PER_CORE",
            "hardware threads per core (default: the site's smt)",
        ),
    ):
        g.add_argument(flag, type=_count, default=env(var), help=f"{text} [{var}]")
    g.add_argument(
        "--time",
        default=env("HPCRING_TIME"),
        help="walltime as minutes or [D-]HH:MM:SS, e.g. 30 or 02:00:00; default the partition's "
        "[HPCRING_TIME]",
    )
    g.add_argument(
        "--partition",
        default=env("HPCRING_PARTITION"),
        help="partition, QOS or queue (as the profile calls it); default the profile's [HPCRING_PARTITION]",
    )


def add_script_args(p: argparse.ArgumentParser) -> None:
    """Flags that only matter for a job script (render, submit)."""
    g = p.add_argument_group("job script")
    for flag, var, text in (
        ("--job-name", "HPCRING_JOB_NAME", "the name the scheduler shows for the job; default hpcring"),
        ("--account", "HPCRING_ACCOUNT", "the account or project the job is charged to"),
        ("--job-output", "HPCRING_JOB_OUTPUT", "file for the job's stdout; default the scheduler's"),
        ("--job-error", "HPCRING_JOB_ERROR", "file for the job's stderr; default with its stdout"),
        ("--workdir", "HPCRING_WORKDIR", "directory the job runs in; default where it was submitted"),
        (
            "--image",
            "HPCRING_IMAGE",
            "container image the ranks run in: a .sif for Apptainer/Singularity, a registry reference for "
            "Kubernetes",
        ),
    ):
        g.add_argument(flag, default=env(var), help=f"{text} [{var}]")
    for flag, var, sep, metavar, text in (
        (
            "--bind",
            "HPCRING_BINDS",
            ",",
            None,
            "a path bound into the container, SRC[:DST]; repeatable; the variable is comma-separated "
            "[HPCRING_BINDS]",
        ),
        (
            "--module",
            "HPCRING_MODULES",
            ",",
            None,
            "an environment module the script loads; repeatable; the variable is comma-separated "
            "[HPCRING_MODULES]",
        ),
        (
            "--env",
            "HPCRING_ENV",
            "\n",
            "KEY=VALUE",
            "a variable set for the ranks; repeatable; the variable holds one per line [HPCRING_ENV]",
        ),
        (
            "--step",
            "HPCRING_STEPS",
            "\n",
            "COMMAND",
            "a shell command run by every rank; repeat for steps with a barrier between them "
            "(the variable holds one per line) [HPCRING_STEPS]",
        ),
    ):
        g.add_argument(flag, action="append", default=env_list(var, sep), metavar=metavar, help=text)
    g.add_argument(
        "--requeue-on-limit",
        nargs="?",
        const=str(requeue.DEFAULT_GRACE_S),
        default=env("HPCRING_REQUEUE_ON_LIMIT"),
        metavar="GRACE",
        help="warn the ranks GRACE s (default 120) before the time limit; they checkpoint and the job is "
        "requeued, then resumes (docs/guide/elastic.md) [HPCRING_REQUEUE_ON_LIMIT]",
    )
    g.add_argument(
        "--checkpoint-dir",
        default=env("HPCRING_CHECKPOINT_DIR"),
        help="with --requeue-on-limit: the shared folder of the checkpoints (default: "
        "hpcring-checkpoint-NAME in the working directory) [HPCRING_CHECKPOINT_DIR]",
    )
    g.add_argument(
        "--launcher",
        default=env("HPCRING_LAUNCHER"),
        choices=LAUNCHERS,
        help="override the profile's launcher [HPCRING_LAUNCHER]",
    )
    g.add_argument(
        "--gpu-aware-mpi",
        action=argparse.BooleanOptionalAction,
        default=_tristate("HPCRING_GPU_AWARE_MPI"),
        help="the rank program links the MPI's GPU transfer library (see `hpcring doctor`): set the "
        "profile's GPU-aware MPI variables (MPICH_GPU_SUPPORT_ENABLED=1); default: the profile's "
        "[HPCRING_GPU_AWARE_MPI]",
    )
    g.add_argument(
        "--inline-files",
        action="store_true",
        default=env_flag("HPCRING_INLINE_FILES"),
        help="write the ERF/rankfile inside the script even with -o [HPCRING_INLINE_FILES]",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every rank runs")


def _tristate(var: str) -> bool | None:
    """A yes/no environment default; None (the profile decides) when unset or empty."""
    raw = os.environ.get(var, "").strip().lower()
    if not raw:
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{var}={raw!r}: expected one of 1, true, yes, on, 0, false, no or off")


def load_profile(args: argparse.Namespace) -> Profile:
    if not args.profile:
        raise ConfigError(
            "no profile given: pass --profile NAME or set HPCRING_PROFILE; built-in: "
            + ", ".join(profmod.builtin_names())
        )
    prof = profmod.load(args.profile)
    if prof.retired_warning:
        print(f"hpcring: warning: {prof.retired_warning}", file=sys.stderr)
    return prof


def _command(args: argparse.Namespace) -> list[str]:
    cmd: Sequence[str] = getattr(args, "command", None) or []
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return cmd


def flag_document(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as the job-file keys they stand for (what `job.check` validates)."""
    doc: dict[str, Any] = {}
    for key in ("nodes", "ranks_per_node", "ranks", "gpus_per_rank", "cpus_per_rank", "threads_per_core"):
        if getattr(args, key) is not None:
            doc[key] = getattr(args, key)
    if args.time is not None:
        doc["time"] = int(args.time) if args.time.isdigit() else args.time
    if args.partition is not None:
        doc["partition"] = args.partition
    if hasattr(args, "job_name"):
        for key, attr in (
            ("name", "job_name"),
            ("account", "account"),
            ("output", "job_output"),
            ("error", "job_error"),
            ("workdir", "workdir"),
            ("image", "image"),
        ):
            if getattr(args, attr) is not None:
                doc[key] = getattr(args, attr)
        for key, attr in (("binds", "bind"), ("modules", "module")):
            if getattr(args, attr):
                doc[key] = list(getattr(args, attr))
        if args.step:
            doc["steps"] = [{"run": line} for line in args.step]
        if args.requeue_on_limit is not None:
            grace = args.requeue_on_limit
            doc["requeue"] = {"grace": int(grace) if grace.lstrip("-").isdigit() else grace}
    return doc


def _requeue(args: argparse.Namespace, spec: JobSpec) -> requeue.RequeueSpec | None:
    """The job file's `requeue:` with the flags over it; --checkpoint-dir alone does not turn it on."""
    current = spec.requeue
    if args.requeue_on_limit is not None:
        current = replace(current or requeue.RequeueSpec(), grace_s=int(args.requeue_on_limit))
    if current is not None and args.checkpoint_dir:
        current = replace(current, checkpoint_dir=args.checkpoint_dir)
    return current


def job_from_args(args: argparse.Namespace) -> JobSpec:
    """The JobSpec: the job file (if any) with every given flag applied over it.

    The flags are validated as a job document by `job.check`, the same rules as the job file's keys.
    """
    spec = jobmod.load(args.job) if args.job else JobSpec()
    time_s = jobmod.check(flag_document(args), "", flag_label)
    changes: dict[str, Any] = {
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "ranks": args.ranks,
        "gpus_per_rank": args.gpus_per_rank,
        "cpus_per_rank": args.cpus_per_rank,
        "threads_per_core": args.threads_per_core,
        "time_s": time_s,
        "partition": args.partition,
    }
    if hasattr(args, "job_name"):
        steps = jobmod.steps_from_cli(_command(args), args.step)
        changes.update(
            name=args.job_name,
            account=args.account,
            output=args.job_output,
            error=args.job_error,
            workdir=args.workdir,
            image=args.image,
            binds=(*spec.binds, *args.bind) if args.bind else None,
            modules=(*spec.modules, *args.module) if args.module else None,
            env=jobmod.parse_env(args.env) if args.env else None,
            gpu_aware_mpi=args.gpu_aware_mpi,
            steps=steps or None,
            requeue=_requeue(args, spec),
        )
    # A flag for one of ranks / ranks-per-node replaces the job file's value of the other.
    if args.ranks is not None and args.ranks_per_node is None:
        spec = replace(spec, ranks_per_node=None)
    if args.ranks_per_node is not None and args.ranks is None:
        spec = replace(spec, ranks=None)
    return jobmod.override(spec, **changes)
