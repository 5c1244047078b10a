"""`hpcring run`: launch a command on N ranks with the installed MPI (flags mirror horovodrun's).

Every flag defaults from an HPCRING_* environment variable, so CI and batch scripts can set them once.
Engine settings (fusion threshold, cycle time, ...) reach every rank as the variables the engine reads.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING

from hpcring.cli import horovodrun_flags
from hpcring.cli.flag_values import env, env_flag, number
from hpcring.config import (
    ALGORITHMS,
    COLLECTIVE_TIMEOUT_VAR,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    MAX_RANKS,
    TIMELINE_DYNAMIC,
    parse_timeout,
)
from hpcring.contracts.wallclock import CHECKPOINT_DIR
from hpcring.errors import ConfigError, choices
from hpcring.launch.command import LaunchSpec, build, describe
from hpcring.launch.hosts import parse_host_list, parse_hostfile
from hpcring.launch.run_summary import summary
from hpcring.launch.target import check_command

if TYPE_CHECKING:
    from hpcring.launch.flavour import MpiInstall

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the `hpcring run` flags; defaults come from the HPCRING_* variable named in each help text."""
    parser.usage = "hpcring run -np N [options] -- command [args...]"
    add = parser.add_argument
    add(
        "-np",
        "-n",
        dest="np",
        default=env("HPCRING_NP"),
        metavar="N",
        help="number of ranks to start [HPCRING_NP]",
    )
    add(
        "-H",
        "--hosts",
        default=env("HPCRING_HOSTS"),
        metavar="H:N,...",
        help="hosts and their slots, e.g. node1:4,node2:4; default: this machine [HPCRING_HOSTS]",
    )
    add(
        "--hostfile",
        default=env("HPCRING_HOSTFILE"),
        help="file of hosts, one 'host slots=N' or 'host:N' line each (instead of -H) [HPCRING_HOSTFILE]",
    )
    add(
        "--mpi",
        nargs="?",
        const=None,
        default=env("HPCRING_MPI"),
        help="the MPI flavour this job must find, openmpi or mpich; a bare --mpi (horovodrun's) asserts "
        "none; default: whichever is installed [HPCRING_MPI]",
    )
    add(
        "--emulate-nodes",
        default=env("HPCRING_EMULATE_NODES"),
        metavar="K",
        help="testing aid: split the ranks into K contiguous pretend nodes, so node-aware code runs on one "
        "machine [HPCRING_EMULATE_NODES]",
    )
    add(
        "--no-prefix",
        action="store_true",
        default=env_flag("HPCRING_NO_PREFIX"),
        help="print the ranks' output without the [rank]<stream>: tag on each line [HPCRING_NO_PREFIX]",
    )
    add(
        "--rsh-agent",
        default=env("HPCRING_RSH_AGENT"),
        help="program that starts processes on other hosts instead of ssh [HPCRING_RSH_AGENT]",
    )
    add(
        "--start-timeout",
        default=env("HPCRING_START_TIMEOUT") or "120",
        metavar="S",
        help="seconds every rank has to start and check in before the job is ended; default 120 "
        "[HPCRING_START_TIMEOUT]",
    )
    add(
        "--yield-when-idle",
        default=env("HPCRING_YIELD_WHEN_IDLE") or "auto",
        help="Open MPI's yield_when_idle, so waiting ranks give up their core: auto (on when ranks "
        "outnumber cores), on or off; default auto [HPCRING_YIELD_WHEN_IDLE]",
    )
    add(
        "--no-fail-fast",
        action="store_true",
        default=env_flag("HPCRING_NO_FAIL_FAST"),
        help="do not run Python commands under hpcring.launch.pyrun, which makes a rank that raises after "
        "MPI_Init exit at once instead of hanging in MPI_Finalize [HPCRING_NO_FAIL_FAST]",
    )
    add(
        "--horovod",
        action="store_true",
        default=env_flag("HPCRING_HOROVOD"),
        help="run Horovod scripts unchanged: `import horovod` resolves to hpcring in every rank; refused "
        "when a real Horovod is installed (docs/guide/torch.md) [HPCRING_HOROVOD]",
    )
    add(
        "--dry-run",
        action="store_true",
        default=env_flag("HPCRING_DRY_RUN"),
        help="print the mpiexec line and the ranks' environment, start nothing [HPCRING_DRY_RUN]",
    )
    add(
        "--verbose",
        action="store_true",
        default=env_flag("HPCRING_VERBOSE"),
        help="print the mpiexec line before starting it [HPCRING_VERBOSE]",
    )
    add(
        "--quiet",
        action="store_true",
        default=env_flag("HPCRING_QUIET"),
        help="no startup line naming the ranks, hosts and MPI and no closing summary (errors and elastic "
        "notes still print) [HPCRING_QUIET]",
    )
    eng = parser.add_argument_group("engine settings (exported to every rank)")
    e = eng.add_argument
    e(
        "--fusion-threshold-mb",
        metavar="MB",
        help="largest fused collective, in MiB (exported in bytes); 0 turns fusion off; default 64 "
        "[HPCRING_FUSION_THRESHOLD]",
    )
    e(
        "--cycle-time-ms",
        metavar="MS",
        help="least time between two negotiation cycles, in milliseconds; default 1 [HPCRING_CYCLE_TIME]",
    )
    e(
        "--cache-capacity",
        metavar="N",
        help="response-cache entries that let repeated collectives skip negotiation; 0 turns it off; "
        "default 1024 [HPCRING_CACHE_CAPACITY]",
    )
    e(
        "--timeline-filename",
        metavar="PATH",
        help="write a Chrome-trace timeline of every collective to PATH [HPCRING_TIMELINE]",
    )
    e(
        "--timeline-mark-cycles",
        action="store_true",
        help="mark each negotiation cycle in the timeline [HPCRING_TIMELINE_MARK_CYCLES]",
    )
    e(
        "--stall-check-warning-time-seconds",
        metavar="S",
        help="seconds a collective may wait for missing ranks before a warning names them; default 60 "
        "[HPCRING_STALL_CHECK_TIME_SECONDS]",
    )
    e(
        "--stall-check-shutdown-time-seconds",
        metavar="S",
        help="seconds of such a stall before every rank stops with an error; 0 never; default 0 "
        "[HPCRING_STALL_SHUTDOWN_TIME_SECONDS]",
    )
    e(
        "--no-stall-check",
        action="store_true",
        help="turn the stall inspector's warnings off [HPCRING_STALL_CHECK_DISABLE]",
    )
    eng.add_argument(
        "--collective-timeout",
        metavar="SECONDS",
        help=f"end the job when a collective every rank submitted has not completed in SECONDS; 0 never; "
        f"default {DEFAULT_COLLECTIVE_TIMEOUT_S:g} [{COLLECTIVE_TIMEOUT_VAR}]",
    )
    e(
        "--allreduce-algorithm",
        metavar="ALG",
        help=f"the allreduce algorithm, one of {', '.join(ALGORITHMS)}; default auto (chosen by size and "
        "node layout) [HPCRING_ALLREDUCE_ALGORITHM]",
    )
    e(
        "--log-level",
        metavar="LEVEL",
        help=f"hpcring's log level on every rank, one of {', '.join(LOG_LEVELS)}; default warning "
        "[HPCRING_LOG_LEVEL]",
    )
    e(
        "--checkpoint-dir",
        metavar="DIR",
        help="shared folder where hvd.elastic checkpoints on a wall-clock warning (SIGUSR1/SIGUSR2 to "
        "hpcring run) and resumes from (docs/guide/elastic.md) [HPCRING_CHECKPOINT_DIR]",
    )
    horovodrun_flags.register(parser)
    add("command", nargs=argparse.REMAINDER, help="the command each rank runs, after --")


def engine_settings(args: argparse.Namespace) -> dict[str, str]:
    """Engine flags as the variables the ranks read; unset flags are left to the environment."""
    out: dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        mb = number(float, args.fusion_threshold_mb, "--fusion-threshold-mb", minimum=0)
        out["HPCRING_FUSION_THRESHOLD"] = str(int(mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        out["HPCRING_CYCLE_TIME"] = f"{number(float, args.cycle_time_ms, '--cycle-time-ms', minimum=0):g}"
    if args.cache_capacity is not None:
        capacity = number(int, args.cache_capacity, "--cache-capacity", minimum=0)
        out["HPCRING_CACHE_CAPACITY"] = str(int(capacity))
    if args.timeline_filename:
        name = args.timeline_filename
        out["HPCRING_TIMELINE"] = name if name == TIMELINE_DYNAMIC else os.path.abspath(name)
    if args.timeline_mark_cycles:
        out["HPCRING_TIMELINE_MARK_CYCLES"] = "1"
    for flag, attr, var in (
        (
            "--stall-check-warning-time-seconds",
            "stall_check_warning_time_seconds",
            "HPCRING_STALL_CHECK_TIME_SECONDS",
        ),
        (
            "--stall-check-shutdown-time-seconds",
            "stall_check_shutdown_time_seconds",
            "HPCRING_STALL_SHUTDOWN_TIME_SECONDS",
        ),
    ):
        if getattr(args, attr) is not None:
            out[var] = f"{number(float, getattr(args, attr), flag, minimum=0):g}"
    if args.no_stall_check:
        out["HPCRING_STALL_CHECK_DISABLE"] = "1"
    if args.collective_timeout is not None or env(COLLECTIVE_TIMEOUT_VAR) is not None:
        out[COLLECTIVE_TIMEOUT_VAR] = f"{collective_timeout(args):g}"
    if args.allreduce_algorithm is not None:
        if args.allreduce_algorithm not in ALGORITHMS:
            raise ConfigError(
                f"--allreduce-algorithm {args.allreduce_algorithm!r}; allowed: {choices(ALGORITHMS)}"
            )
        out["HPCRING_ALLREDUCE_ALGORITHM"] = args.allreduce_algorithm
    if args.checkpoint_dir:
        out[CHECKPOINT_DIR] = os.path.abspath(args.checkpoint_dir)
    if args.log_level is not None:
        if args.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"--log-level {args.log_level!r}; allowed: {choices(LOG_LEVELS)}")
        out["HPCRING_LOG_LEVEL"] = args.log_level.lower()
    return out


def collective_timeout(args: argparse.Namespace) -> float:
    """Seconds of `--collective-timeout`, else of HPCRING_COLLECTIVE_TIMEOUT, else the default (0: off);
    a bad value is a ConfigError naming the flag or the variable it came from, before anything starts."""
    if args.collective_timeout is not None:
        return parse_timeout("--collective-timeout", str(args.collective_timeout))
    raw = env(COLLECTIVE_TIMEOUT_VAR)
    return parse_timeout(COLLECTIVE_TIMEOUT_VAR, raw) if raw is not None else DEFAULT_COLLECTIVE_TIMEOUT_S


def _yield(text: str) -> bool | None:
    value = text.lower()
    if value not in ("auto", "on", "off", "1", "0", "true", "false"):
        raise ConfigError(f"--yield-when-idle {text!r}; allowed: {choices(('auto', 'on', 'off'))}")
    return None if value == "auto" else value in ("on", "1", "true")


def _np(args: argparse.Namespace) -> int:
    """-np, or in elastic mode the first world's lower bound (--min-np) when -np is not given."""
    if args.np is not None:
        return int(number(int, str(args.np), "-np", minimum=1, maximum=MAX_RANKS))
    if args.min_np is not None:
        return int(number(int, str(args.min_np), "--min-np", minimum=1, maximum=MAX_RANKS))
    raise ConfigError("-np N is required (the number of ranks), e.g. hpcring run -np 4 -- python train.py")


def _horovod_alias(args: argparse.Namespace) -> dict[str, str]:
    """--horovod: the alias's variables for every rank, once no real Horovod is found
    (hpcring.horovod_alias)."""
    if not args.horovod:
        return {}
    from hpcring.contracts.horovod_alias import rank_environment, refuse_if_real_horovod

    refuse_if_real_horovod()
    return rank_environment(os.environ.get("PYTHONPATH"))


def build_spec(args: argparse.Namespace, flavour: str = "openmpi") -> LaunchSpec:
    """Validate the flags into a LaunchSpec; any mistake is a ConfigError (exit 2) before anything starts."""
    np = _np(args)
    if args.hosts and args.hostfile:
        raise ConfigError("give either -H/--hosts or --hostfile, not both")
    hosts = (
        parse_host_list(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else []
    )
    emulate = None
    if args.emulate_nodes is not None:
        emulate = int(number(int, str(args.emulate_nodes), "--emulate-nodes", minimum=1, maximum=MAX_RANKS))
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    mpi_args, mpi_env = horovodrun_flags.mpi_extras(args, flavour)
    return LaunchSpec(
        np=np,
        command=tuple(command),
        hosts=tuple(hosts),
        emulate_nodes=emulate,
        prefix=not args.no_prefix,
        rsh_agent=os.path.abspath(args.rsh_agent) if args.rsh_agent else None,
        yield_when_idle=_yield(args.yield_when_idle),
        start_timeout_s=number(float, str(args.start_timeout), "--start-timeout", minimum=1),
        settings={**engine_settings(args), **horovodrun_flags.rank_settings(args), **_horovod_alias(args)},
        fail_fast=not args.no_fail_fast,
        mpi_args=mpi_args,
        mpi_env=mpi_env,
        output_dir=os.path.abspath(args.output_filename) if args.output_filename else None,
        timestamp=args.prefix_output_with_timestamp,
    )


def main(args: argparse.Namespace) -> int:
    from hpcring.launch.flavour import resolve
    from hpcring.launch.supervisor import Supervisor

    if args.version:
        from hpcring.version import __version__

        print(f"hpcring {__version__} (hpcring run takes horovodrun's flags)")
        return 0
    if args.check_build:
        print(horovodrun_flags.check_build())
        return 0
    horovodrun_flags.apply_config_file(args)
    horovodrun_flags.refuse(args)
    install = resolve(args.mpi)
    spec = build_spec(args, install.flavour)
    elastic = horovodrun_flags.elastic_spec(args, list(spec.hosts), _np(args))
    if elastic is not None:
        return _run_elastic(args, install, spec, elastic)
    spec.oversubscribed()  # validates -np against the hosts' slots before anything starts
    sup = Supervisor(install, spec)
    if args.dry_run:
        argv, env = build(install, spec, sup.wrapper_argv(["HOST:PORT"]), {})
        extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        print((extra + " " if extra else "") + shlex.join(argv))
        return 0
    check_command(spec.command)

    def show(argv: list[str]) -> None:
        if not args.quiet:
            line = describe(install, spec.np, spec.hosts, spec.emulate_nodes)
            print(f"hpcring run: {line}", file=sys.stderr)
        if args.verbose:
            print(f"hpcring run: {shlex.join(argv)}", file=sys.stderr)

    began = time.monotonic()
    code = sup.run(on_start=show)
    if code == 0 and not args.quiet:
        print(summary(spec.np, time.monotonic() - began, sup.rank_times()), file=sys.stderr)
    return code


def _run_elastic(args: argparse.Namespace, install: MpiInstall, spec: LaunchSpec, elastic: object) -> int:
    """Elastic mode: the driver runs worlds on the usable hosts until training finishes
    (docs/guide/elastic.md)."""
    from dataclasses import replace

    from hpcring.launch.elastic.driver import ElasticDriver, ElasticSpec

    assert isinstance(elastic, ElasticSpec)
    if args.dry_run:
        raise ConfigError("--dry-run cannot show an elastic job: its worlds depend on the hosts at run time")
    check_command(spec.command)
    return ElasticDriver(install, replace(spec, hosts=()), elastic).run()
