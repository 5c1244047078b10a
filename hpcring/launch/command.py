"""The mpiexec command line and environment for each MPI flavour, with defaults that work out of the box.

Kept free of process handling so tests can inspect exactly what would run. Settings that must reach remote
daemons go on the command line (Open MPI `--mca`, hydra `-genv`); settings only mpiexec itself reads go in its
environment, and so does the job's secret, which must never appear in any process's argv.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcring.errors import ConfigError
from hpcring.launch.flavour import MpiInstall
from hpcring.launch.hosts import Host, check_capacity, is_local
from hpcring.launch.protocol import TOKEN_VARIABLE

_FLAVOUR_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH"}


@dataclass(frozen=True)
class LaunchSpec:
    """Everything `hpcring run` was asked to do, validated."""

    np: int
    command: tuple[str, ...]
    hosts: tuple[Host, ...] = ()  # empty: this machine only
    emulate_nodes: int | None = None
    prefix: bool = True
    rsh_agent: str | None = None
    yield_when_idle: bool | None = None  # None: when ranks on one host outnumber its cores
    start_timeout_s: float = 120.0
    fail_fast: bool = True  # Python ranks exit without MPI_Finalize on error (hpcring.launch.pyrun)
    settings: Mapping[str, str] = field(default_factory=dict)  # engine settings exported to every rank
    mpi_args: tuple[
        str, ...
    ] = ()  # extra mpiexec arguments (horovodrun's --mpi-args, --ssh-port, --tcp, ...)
    mpi_env: Mapping[str, str] = field(default_factory=dict)  # variables only mpiexec itself reads
    output_dir: str | None = None  # horovodrun's --output-filename: DIR/rank.N/stdout and stderr
    timestamp: bool = False  # horovodrun's --prefix-output-with-timestamp

    def __post_init__(self) -> None:
        if self.np <= 0:
            raise ConfigError(f"-np must be a positive number of ranks, got {self.np}")
        if not self.command:
            raise ConfigError(
                "no command to run; give it after '--', e.g. hpcring run -np 2 -- python train.py"
            )
        if self.emulate_nodes is not None and not 1 <= self.emulate_nodes <= self.np:
            raise ConfigError(f"--emulate-nodes {self.emulate_nodes} must be between 1 and -np ({self.np})")
        if self.rsh_agent is not None and not (
            os.path.isfile(self.rsh_agent) and os.access(self.rsh_agent, os.X_OK)
        ):
            raise ConfigError(f"--rsh-agent {self.rsh_agent!r} is not an executable file")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"--start-timeout must be positive, got {self.start_timeout_s}")

    @property
    def remote(self) -> bool:
        """True when some host is not this machine (ranks must reach the launcher over the network)."""
        return any(not is_local(h.name) for h in self.hosts)

    def oversubscribed(self) -> bool:
        """Validates -np against the host slots; True when more ranks than slots/cores run on this machine."""
        if self.hosts:
            return check_capacity(self.np, self.hosts)
        return self.np > (os.cpu_count() or 1)

    def master_addr(self) -> str:
        """MASTER_ADDR for torch's env:// rendezvous: the first host (rank 0 runs there)."""
        if not self.remote:
            return "127.0.0.1"
        first = self.hosts[0].name
        # "localhost" would mean a different machine to the remote ranks.
        return socket.gethostname() if first in ("localhost", "127.0.0.1", "::1") else first


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _busy_hosts(spec: LaunchSpec) -> bool:
    """Would ranks outnumber cores somewhere? Remote hosts are assumed to have as many cores as this one."""
    cores = os.cpu_count() or 1
    if not spec.hosts:
        return spec.np > cores
    remaining, most = spec.np, 0
    for host in spec.hosts:  # both flavours fill hosts in order, slot by slot
        take = min(host.slots, remaining)
        most, remaining = max(most, take), remaining - take
    return most > cores or remaining > 0


def build(
    install: MpiInstall, spec: LaunchSpec, wrapper: Sequence[str], base_env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that start `wrapper` (the per-rank wrapper command line) on spec.np ranks."""
    oversubscribe = spec.oversubscribed()
    yield_idle = _busy_hosts(spec) if spec.yield_when_idle is None else spec.yield_when_idle
    env = dict(base_env)
    if install.flavour == "openmpi":
        argv = [install.mpiexec, "-n", str(spec.np), "--bind-to", "none"]
        argv += ["--map-by", "slot:OVERSUBSCRIBE" if oversubscribe else "slot"]
        if spec.hosts:
            argv += ["--host", ",".join(h.spec() for h in spec.hosts)]
        if yield_idle:
            argv += ["--mca", "mpi_yield_when_idle", "1"]
        if _is_root():
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        if spec.rsh_agent:
            # Open MPI 5's PRRTE reads PRTE_MCA_plm_ssh_agent; it ignores OMPI_MCA_plm_rsh_agent.
            env["PRTE_MCA_plm_ssh_agent"] = spec.rsh_agent
        # By name: prterun reads the value from its environment and sends it inside its launch message.
        argv += ["-x", TOKEN_VARIABLE]
    else:
        # Hydra hands its whole environment (the job's token with it) to its proxies over their control
        # sockets; -genvlist would narrow that to the list, so nothing is added here.
        argv = [install.mpiexec, "-n", str(spec.np)]
        if spec.hosts:
            argv += ["-hosts", ",".join(h.spec() for h in spec.hosts)]
        if spec.rsh_agent:
            argv += ["-launcher", "ssh", "-launcher-exec", spec.rsh_agent]
        if spec.remote and base_env.get("UCX_TLS"):
            # Hydra proxies do not forward the launcher's environment to remote hosts by themselves.
            argv += ["-genv", "UCX_TLS", base_env["UCX_TLS"]]
    env.update(spec.mpi_env)
    return [*argv, *spec.mpi_args, *wrapper], env


def describe(install: MpiInstall, np: int, hosts: Sequence[Host], emulate_nodes: int | None = None) -> str:
    """What a launch starts, in one line: '4 ranks on vm:4 with Open MPI 5.0.11 (/venv/bin/mpiexec)'."""
    where = ",".join(h.spec() for h in hosts) or f"{socket.gethostname()}:{np}"
    nodes = f" as {emulate_nodes} emulated nodes" if emulate_nodes else ""
    numbers = re.findall(r"\d+(?:\.\d+)+", install.version)
    mpi = " ".join([_FLAVOUR_NAMES[install.flavour], *numbers[-1:]])
    return f"{np} rank{'s' if np != 1 else ''} on {where}{nodes} with {mpi} ({install.mpiexec})"
