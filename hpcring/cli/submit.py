"""`hpcring submit`: render the job script, submit it with sbatch/bsub/qsub/flux batch (an MPIJob: kubectl
apply), print the job id;
`--wait` returns the job's exit code; `--dry-run` shows the script, its files and the submit command, and
writes and submits nothing."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    from hpcring.cli import job_flags
    from hpcring.cli.flag_values import env, env_flag

    job_flags.add_shape_args(parser)
    job_flags.add_script_args(parser)
    parser.add_argument(
        "-o", "--out", default=env("HPCRING_OUT"), help="write the job script to this path [HPCRING_OUT]"
    )
    parser.add_argument(
        "--script-dir",
        default=env("HPCRING_SCRIPT_DIR") or "hpcring-jobs",
        help="folder for job scripts when -o is not given; default ./hpcring-jobs [HPCRING_SCRIPT_DIR]",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=env_flag("HPCRING_DRY_RUN"),
        help="show the script, its files and the submit command; write and submit nothing [HPCRING_DRY_RUN]",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        default=env_flag("HPCRING_WAIT"),
        help="wait for the job and exit with its exit code [HPCRING_WAIT]",
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=env("HPCRING_POLL") or "0.5",
        help="seconds between state polls with --wait; default 0.5 [HPCRING_POLL]",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=env("HPCRING_WAIT_TIMEOUT"),
        help="give up waiting after this many seconds [HPCRING_WAIT_TIMEOUT]",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        default=env_flag("HPCRING_QUIET"),
        help="with --wait, print no line at each change of the job's state (pending, running, ...); those "
        "lines appear only on a terminal anyway [HPCRING_QUIET]",
    )


def _script_path(args: argparse.Namespace, name: str) -> Path:
    if args.out:
        return Path(args.out)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(args.script_dir) / f"{safe}-{stamp}-{os.getpid()}.sh"


def check_wait_flags(args: argparse.Namespace) -> None:
    """--poll and --wait-timeout are durations: 0, negative or NaN would spin, fail in sleep() or give up
    before the first poll."""
    from hpcring.errors import ConfigError

    for flag, var, value in (
        ("--poll", "HPCRING_POLL", args.poll),
        ("--wait-timeout", "HPCRING_WAIT_TIMEOUT", args.wait_timeout),
    ):
        if value is not None and not value > 0:
            raise ConfigError(f"{flag} [{var}]: {value!r} is too small; allowed: a number of seconds above 0")


def main(args: argparse.Namespace) -> int:
    from hpcring.cli import job_flags, progress
    from hpcring.cli.render import prepare, write_script
    from hpcring.schedulers import submission
    from hpcring.schedulers.plan import Plan

    check_wait_flags(args)
    job = job_flags.job_from_args(args)
    path = _script_path(args, job.name).absolute()
    if job_flags.load_profile(args).site.scheduler == "kubernetes":
        from hpcring.cli import kubernetes

        return kubernetes.submit(args, path if args.out else path.with_suffix(".yaml"))
    p, text = prepare(args, path)
    assert isinstance(p, Plan)
    argv = [*p.submit_argv, str(path)]
    if args.dry_run:
        print(f"# script: {path} {job_flags.NOT_WRITTEN}")
        print(text, end="")
        for f in p.files:
            if f.path:
                print(f"# file: {f.path}\n{f.content}", end="")
        print(f"# would run: {shlex.join(argv)}")
        return 0
    write_script(text, [(f.path, f.content) for f in p.files if f.path], path)
    job_id = submission.submit(p.scheduler, argv)
    print(job_id, flush=True)
    if not args.wait:
        return 0
    on_change = progress.state_printer(sys.stderr, args.quiet)
    result = submission.wait(
        p.scheduler, job_id, poll=args.poll, timeout=args.wait_timeout, on_change=on_change
    )
    print(
        f"hpcring submit: job {job_id} ended: {result.state}, exit code {result.exit_code}", file=sys.stderr
    )
    return result.exit_code
