"""horovodrun's flags on `hpcring run`, for a migrating user's command line (docs/guide/launcher.md).

Each flag is honoured, or refused with one line that says why and what to use instead; a mistake on the
command line is one line too, never an argparse usage dump. The elastic flags build an `ElasticSpec`
(docs/guide/elastic.md). `--config-file` reads Horovod's YAML; flags on the command line win over it, as in
horovodrun.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from hpcring.cli.flag_values import env, env_flag, number
from hpcring.errors import ConfigError, choices
from hpcring.launch.hosts import Host

# Refused flags: why, and what to use instead (one line each).
REFUSED: dict[str, str] = {
    "--gloo": "hpcring runs over MPI only, elastic jobs included (they relaunch an MPI world); drop --gloo",
    "--jsrun": "hpcring run starts ranks with mpiexec; under LSF render a jsrun job with "
    "`hpcring render --profile PROFILE` instead",
    "--ccl": "oneCCL is not available; CPU tensors are reduced over MPI (drop --ccl)",
    "--log-with-timestamp": "hpcring's engine log lines carry no time stamp; use "
    "--prefix-output-with-timestamp to stamp every output line",
    "--mpi-threads-disable": "hpcring's engine thread needs MPI_THREAD_MULTIPLE (it calls MPI alongside the "
    "script's thread); drop the flag",
    "--num-nccl-streams": "hpcring's device plane uses one NCCL communicator stream; drop the flag",
    "--thread-affinity": "use your scheduler's binding (hpcring render places ranks on cores) instead",
    "--gloo-timeout-seconds": "there is no Gloo controller; --start-timeout bounds how long ranks may take "
    "to start",
    "--nics": "use --network-interface IFACE (mpiexec's TCP interface) instead",
    "--binding-args": "pass binding options with --mpi-args '...' (hpcring run binds nothing by default)",
    "--hierarchical-allgather": "allgather always runs as one MPI Allgatherv; only allreduce has a "
    "node-aware path (--hierarchical-allreduce)",
}
# Refused flags that take a value in horovodrun (the others are switches).
_REFUSED_WITH_VALUE = frozenset(
    {"--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds", "--nics", "--binding-args"}
)
# Accepted and true without doing anything: hpcring already behaves so.
HONOURED_NOOPS = ("--no-hierarchical-allgather", "--log-without-timestamp", "--log-hide-timestamp")

ELASTIC_FLAGS = (
    "--min-np",
    "--max-np",
    "--slots-per-host",
    "--host-discovery-script",
    "--elastic-timeout",
    "--reset-limit",
    "--blacklist-cooldown-range",
)


def _one_line_error(prog: str) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message} (hpcring run --help lists the flags)", file=sys.stderr)
        raise SystemExit(2)

    return error


# The autotuner's horovodrun flags: what each sets (docs/guide/torch.md, "Autotuning").
AUTOTUNE_FLAGS = {
    "warmup-samples": "autotune samples discarded at the start; default 3",
    "steps-per-sample": "optimizer steps timed per autotune sample; default 10",
    "bayes-opt-max-samples": "most scored autotune samples; default 20",
    "gaussian-process-noise": "Horovod's Bayesian-search noise; accepted, unused by the coordinate search",
}


def register(parser: argparse.ArgumentParser) -> None:
    """horovodrun's flags that hpcring's own set lacks."""
    parser.error = _one_line_error(parser.prog)  # type: ignore[method-assign,assignment]
    el = parser.add_argument_group("elastic training (horovodrun's flags; docs/guide/elastic.md)")
    add = el.add_argument
    add(
        "--min-np",
        "--min-num-proc",
        default=env("HPCRING_MIN_NP"),
        metavar="N",
        help="elastic: the smallest world that may train; default -np [HPCRING_MIN_NP]",
    )
    add(
        "--max-np",
        "--max-num-proc",
        default=env("HPCRING_MAX_NP"),
        metavar="N",
        help="elastic: the largest world; default every slot discovered [HPCRING_MAX_NP]",
    )
    add(
        "--slots-per-host",
        "--slots",
        default=env("HPCRING_SLOTS_PER_HOST"),
        metavar="N",
        help="slots of a discovered host whose line gives none; default 1 [HPCRING_SLOTS_PER_HOST]",
    )
    add(
        "--host-discovery-script",
        default=env("HPCRING_HOST_DISCOVERY_SCRIPT"),
        metavar="PATH",
        help="elastic: a program that prints the usable 'host:slots' lines, polled every second "
        "[HPCRING_HOST_DISCOVERY_SCRIPT]",
    )
    add(
        "--elastic-timeout",
        default=env("HPCRING_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"),
        metavar="S",
        help="seconds to wait for --min-np slots before the job ends; default 600 "
        "[HOROVOD_ELASTIC_TIMEOUT, HPCRING_ELASTIC_TIMEOUT]",
    )
    add(
        "--reset-limit",
        default=env("HPCRING_RESET_LIMIT"),
        metavar="N",
        help="elastic: relaunches allowed, one more failure ends the job; default unlimited "
        "[HPCRING_RESET_LIMIT]",
    )
    add(
        "--blacklist-cooldown-range",
        nargs=2,
        default=(env("HPCRING_BLACKLIST_COOLDOWN_RANGE") or "").split() or None,
        metavar=("MIN", "MAX"),
        help="seconds a failed host stays out, from MIN doubling up to MAX; default: out for good; the "
        "variable holds 'MIN MAX' [HPCRING_BLACKLIST_COOLDOWN_RANGE]",
    )
    hv = parser.add_argument_group("other horovodrun flags")
    a = hv.add_argument
    a(
        "-p",
        "--ssh-port",
        default=env("HPCRING_SSH_PORT"),
        metavar="PORT",
        help="the port ssh connects to on other hosts (Open MPI); default ssh's own [HPCRING_SSH_PORT]",
    )
    a(
        "-i",
        "--ssh-identity-file",
        default=env("HPCRING_SSH_IDENTITY_FILE"),
        metavar="FILE",
        help="the private key ssh uses for other hosts (Open MPI); default ssh's own "
        "[HPCRING_SSH_IDENTITY_FILE]",
    )
    a(
        "--network-interface",
        "--network-interfaces",
        default=env("HPCRING_NETWORK_INTERFACE"),
        metavar="IFACE",
        help="the TCP interface(s) MPI uses, comma-separated; default: MPI's choice "
        "[HPCRING_NETWORK_INTERFACE]",
    )
    a(
        "--output-filename",
        default=env("HPCRING_OUTPUT_FILENAME"),
        metavar="DIR",
        help="also write each rank's output to DIR/rank.N/stdout|stderr [HPCRING_OUTPUT_FILENAME]",
    )
    a(
        "--prefix-output-with-timestamp",
        action="store_true",
        default=env_flag("HPCRING_PREFIX_OUTPUT_WITH_TIMESTAMP"),
        help="start each output line with the time it was printed [HPCRING_PREFIX_OUTPUT_WITH_TIMESTAMP]",
    )
    hier = hv.add_mutually_exclusive_group()
    hier.add_argument(
        "--hierarchical-allreduce",
        dest="hierarchical_allreduce",
        action="store_const",
        const=True,
        help="horovodrun's: the node-aware allreduce (--allreduce-algorithm hierarchical)",
    )
    hier.add_argument(
        "--no-hierarchical-allreduce",
        dest="hierarchical_allreduce",
        action="store_const",
        const=False,
        help="horovodrun's: the flat allreduce (--allreduce-algorithm native)",
    )
    a(
        "--disable-cache",
        action="store_true",
        default=env_flag("HPCRING_DISABLE_CACHE"),
        help="turn the response cache off (--cache-capacity 0) [HPCRING_DISABLE_CACHE]",
    )
    a(
        "--mpi-args",
        default=env("HPCRING_MPI_ARGS"),
        metavar="ARGS",
        help="extra arguments for mpiexec, as one shell-quoted string [HPCRING_MPI_ARGS]",
    )
    a(
        "--tcp",
        action="store_true",
        default=env_flag("HPCRING_TCP"),
        help="make MPI use TCP only, no shared memory or fabric [HPCRING_TCP]",
    )
    a(
        "--config-file",
        default=env("HPCRING_CONFIG_FILE"),
        metavar="YAML",
        help="Horovod's YAML config file of these settings; flags win over it [HPCRING_CONFIG_FILE]",
    )
    a("-cb", "--check-build", action="store_true", help="show what this installation provides")
    a("--version", action="store_true", help="print hpcring's version and exit")
    a(
        "--autotune",
        action="store_true",
        default=None,
        help="pick the fusion threshold and cycle time from the first steps' speed [HOROVOD_AUTOTUNE]",
    )
    a(
        "--autotune-log-file",
        metavar="PATH",
        help="CSV of every setting the autotuner scored and its choice [HOROVOD_AUTOTUNE_LOG]",
    )
    for name, text in AUTOTUNE_FLAGS.items():
        a(
            f"--autotune-{name}",
            metavar="N",
            help=f"{text} [HOROVOD_AUTOTUNE_{name.upper().replace('-', '_')}]",
        )
    a("-hostfile", dest="hostfile", help=argparse.SUPPRESS)
    for flag in (*REFUSED, *HONOURED_NOOPS):
        if flag in _REFUSED_WITH_VALUE:
            a(flag, dest=_dest(flag), default=None, help=argparse.SUPPRESS)
        else:
            a(flag, dest=_dest(flag), action="store_const", const=True, default=None, help=argparse.SUPPRESS)


def _dest(flag: str) -> str:
    return "hvd_" + flag.lstrip("-").replace("-", "_")


def refuse(args: argparse.Namespace) -> None:
    """The first refused flag given: ConfigError with its one line."""
    for flag, why in REFUSED.items():
        if getattr(args, _dest(flag), None) is not None:
            raise ConfigError(f"{flag} is not supported: {why}")


# ---- horovodrun's config file ------------------------------------------------------------------------------
# section -> key -> (args attribute, converter); Horovod's config_parser names.
_CONFIG: dict[str, dict[str, str]] = {
    "params": {
        "fusion_threshold_mb": "fusion_threshold_mb",
        "cycle_time_ms": "cycle_time_ms",
        "cache_capacity": "cache_capacity",
        "hierarchical_allreduce": "hierarchical_allreduce",
        "hierarchical_allgather": "hvd_hierarchical_allgather",
    },
    "autotune": {
        "enabled": "autotune",
        "log_file": "autotune_log_file",
        "warmup_samples": "autotune_warmup_samples",
        "steps_per_sample": "autotune_steps_per_sample",
        "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
        "gaussian_process_noise": "autotune_gaussian_process_noise",
    },
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {
        "enabled": "stall_check_enabled",
        "warning_time_seconds": "stall_check_warning_time_seconds",
        "shutdown_time_seconds": "stall_check_shutdown_time_seconds",
    },
    "logging": {"level": "log_level", "timestamp": "hvd_log_with_timestamp"},
    "library_options": {
        "mpi_threads_disable": "hvd_mpi_threads_disable",
        "num_nccl_streams": "hvd_num_nccl_streams",
    },
}


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill flags not given on the command line from Horovod's YAML config file."""
    if not args.config_file:
        return
    import yaml

    from hpcring.schedulers import safe_yaml

    try:
        with open(args.config_file) as f:
            data = safe_yaml.load(f) or {}
    except OSError as exc:
        raise ConfigError(f"--config-file {args.config_file!r} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config-file {args.config_file!r} is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config-file {args.config_file!r}: expected sections {choices(_CONFIG)}")
    for section, values in data.items():
        keys = _CONFIG.get(str(section))
        if keys is None:
            raise ConfigError(f"--config-file: unknown section {section!r}; allowed: {choices(_CONFIG)}")
        for key, value in (values or {}).items():
            attr = keys.get(str(key))
            if attr is None:
                raise ConfigError(f"--config-file: unknown key {section}.{key}; allowed: {choices(keys)}")
            _set_from_config(args, attr, value)


def _set_from_config(args: argparse.Namespace, attr: str, value: Any) -> None:
    if attr == "stall_check_enabled":
        if value is False and not args.no_stall_check:
            args.no_stall_check = True
        return
    if attr.startswith("hvd_") or attr in ("hierarchical_allreduce", "autotune"):
        if getattr(args, attr, None) is None and value not in (None, False):
            setattr(args, attr, value)
        elif attr == "hierarchical_allreduce" and args.hierarchical_allreduce is None:
            args.hierarchical_allreduce = bool(value)
        return
    if attr == "timeline_mark_cycles":
        args.timeline_mark_cycles = args.timeline_mark_cycles or bool(value)
        return
    if getattr(args, attr, None) is None and value is not None:
        setattr(args, attr, str(value))


# ---- what the flags do -------------------------------------------------------------------------------------
def rank_settings(args: argparse.Namespace) -> dict[str, str]:
    """Variables exported to every rank by horovodrun's flags."""
    out: dict[str, str] = {}
    if args.hierarchical_allreduce is not None:
        # Horovod's flat allreduce is the MPI library's own: hpcring's "native" algorithm.
        out["HPCRING_ALLREDUCE_ALGORITHM"] = "hierarchical" if args.hierarchical_allreduce else "native"
        out["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if args.hierarchical_allreduce else "0"
    if args.disable_cache:
        out["HPCRING_CACHE_CAPACITY"] = "0"
    if args.autotune:
        out["HOROVOD_AUTOTUNE"] = "1"
    if args.autotune_log_file:
        out["HOROVOD_AUTOTUNE_LOG"] = os.path.abspath(args.autotune_log_file)
    for name in ("warmup_samples", "steps_per_sample", "bayes_opt_max_samples", "gaussian_process_noise"):
        value = getattr(args, f"autotune_{name}")
        if value is not None:
            number(float, str(value), f"--autotune-{name.replace('_', '-')}")
            out[f"HOROVOD_AUTOTUNE_{name.upper()}"] = str(value)
    return out


def mpi_extras(args: argparse.Namespace, flavour: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(extra mpiexec arguments, mpiexec's environment) for --ssh-port, -i, --network-interface, --tcp,
    --mpi-args."""
    argv: list[str] = []
    env_out: dict[str, str] = {}
    ssh: list[str] = []
    if args.ssh_port:
        port = int(number(float, args.ssh_port, "--ssh-port"))
        if not 0 < port < 65536:
            raise ConfigError(f"--ssh-port {args.ssh_port} is not a TCP port (1..65535)")
        ssh += ["-p", str(port)]
    if args.ssh_identity_file:
        if not os.path.isfile(args.ssh_identity_file):
            raise ConfigError(f"--ssh-identity-file {args.ssh_identity_file!r} does not exist")
        ssh += ["-i", os.path.abspath(args.ssh_identity_file)]
    if ssh:
        if flavour != "openmpi":
            raise ConfigError(
                "--ssh-port/--ssh-identity-file: MPICH's hydra takes no ssh options; set Port/IdentityFile "
                "for the hosts in ~/.ssh/config, or give --rsh-agent a wrapper script"
            )
        env_out["PRTE_MCA_plm_ssh_args"] = shlex.join(ssh)
    if args.network_interface:
        iface = args.network_interface
        if flavour == "openmpi":
            argv += ["--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface]
        else:
            argv += ["-iface", iface.split(",")[0]]
            env_out["FI_TCP_IFACE"] = iface.split(",")[0]
    if args.tcp:
        if flavour == "openmpi":
            argv += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        else:
            env_out.update(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp")
    if args.mpi_args:
        argv += shlex.split(args.mpi_args)
    return tuple(argv), env_out


def elastic_spec(args: argparse.Namespace, hosts: list[Host], np: int | None) -> Any:
    """The ElasticSpec when an elastic flag is given (min-np, max-np or a discovery script), else None."""
    if args.min_np is None and args.max_np is None and args.host_discovery_script is None:
        for flag in ("--reset-limit", "--elastic-timeout", "--blacklist-cooldown-range"):
            if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, []):
                raise ConfigError(f"{flag} applies to elastic jobs: add --min-np N (or a discovery script)")
        return None
    from hpcring.launch.elastic.driver import ElasticSpec

    def count(text: Any, flag: str, minimum: int) -> int:
        value = number(float, str(text), flag)
        if value != int(value) or value < minimum:
            raise ConfigError(f"{flag} must be a whole number >= {minimum}, got {text}")
        return int(value)

    min_np = count(args.min_np, "--min-np", 1) if args.min_np is not None else np
    if min_np is None:
        raise ConfigError("elastic mode needs --min-np N (or -np N, the default minimum)")
    cooldown = None
    if args.blacklist_cooldown_range:
        lo, hi = (number(float, v, "--blacklist-cooldown-range") for v in args.blacklist_cooldown_range)
        cooldown = (lo, hi)
    return ElasticSpec(
        min_np=min_np,
        max_np=count(args.max_np, "--max-np", 1) if args.max_np is not None else None,
        slots_per_host=count(args.slots_per_host or 1, "--slots-per-host", 1),
        discovery_script=os.path.abspath(args.host_discovery_script) if args.host_discovery_script else None,
        hosts=tuple(hosts),
        timeout_s=number(float, str(args.elastic_timeout or 600), "--elastic-timeout"),
        reset_limit=count(args.reset_limit, "--reset-limit", 0) if args.reset_limit is not None else None,
        cooldown=cooldown,
    )


def check_build() -> str:
    """horovodrun --check-build's report for this installation."""
    from hpcring import _deps
    from hpcring.version import __version__

    torch_ok = _deps.available("torch")
    nccl = False
    if torch_ok:
        import torch.distributed as dist

        nccl = dist.is_available() and dist.is_nccl_available()
    mpi = _deps.available("mpi4py")

    def box(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    return "\n".join(
        [
            f"hpcring v{__version__} (horovod.torch API):",
            "",
            "Available Frameworks:",
            "    [ ] TensorFlow",
            f"    {box(torch_ok)} PyTorch",
            "    [ ] MXNet",
            "",
            "Available Controllers:",
            f"    {box(mpi)} MPI",
            "    [ ] Gloo",
            "",
            "Available Tensor Operations:",
            f"    {box(nccl)} NCCL",
            "    [ ] DDL",
            "    [ ] CCL",
            f"    {box(mpi)} MPI",
            "    [ ] Gloo",
        ]
    )
