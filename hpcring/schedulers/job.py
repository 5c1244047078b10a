"""Job specification: what to run and how big, from a YAML job file and/or command-line flags.

The spec holds only what the user asked for; defaults that depend on the node (ranks per node = one per GPU,
CPUs per rank = even share of the GPU's closest cores) are resolved against a profile in `mapping.resolve`, so
the same job file can be rendered for several sites.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hpcring.config import MAX_RANKS  # the job schema's maximum for `ranks` too
from hpcring.errors import ConfigError
from hpcring.schedulers import requeue, safe_yaml, textfile, walltime
from hpcring.schedulers.requeue import RequeueSpec
from hpcring.schedulers.validation import validate


@dataclass(frozen=True)
class Step:
    """One `run:` step: every rank runs `argv`; the next step starts only when all ranks of this one ended."""

    argv: tuple[str, ...]
    name: str = ""


@dataclass(frozen=True)
class JobSpec:
    """A job as asked for; None means "use the profile's default"."""

    nodes: int = 1
    name: str = "hpcring"
    ranks: int | None = None
    ranks_per_node: int | None = None
    gpus_per_rank: int | None = None
    cpus_per_rank: int | None = None
    threads_per_core: int | None = None
    time_s: int | None = None
    partition: str | None = None
    account: str | None = None
    output: str | None = None
    error: str | None = None
    workdir: str | None = None
    image: str | None = None
    binds: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    steps: tuple[Step, ...] = field(default_factory=tuple)
    elastic: tuple[int, int] | None = None  # (min_nodes, max_restarts): hpcring.launch.elastic.batch
    # The rank program links the MPI's GPU transfer library (network.py); None: the profile's default.
    gpu_aware_mpi: bool | None = None
    requeue: RequeueSpec | None = None  # train past the wall clock: hpcring.schedulers.requeue


def command_argv(command: str | Sequence[str]) -> tuple[str, ...]:
    """A list is an argv kept exactly; a string is a shell command line, run by `bash -c` (RiseML style)."""
    if isinstance(command, str):
        return ("bash", "-c", command)
    return tuple(command)


def _env_str(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def check(data: Mapping[str, Any], where: str, label: Callable[[str], str] | None = None) -> int | None:
    """The one validation of job fields, for job files and `map`/`render`/`submit` flags alike: the job
    schema (job.v1.schema.json: types, counts of at least 1, the command's forms), then what a schema cannot
    say (the walltime's fields below 60). Returns the walltime in seconds, None when `time` is not given.

    `label` turns a key into what the user typed (`cpus_per_rank` -> `--cpus-per-rank`); `where` names the
    file, empty for flags.
    """
    validate(data, "job", where, ConfigError, label)
    nodes, per_node = data.get("nodes"), data.get("ranks_per_node")
    if isinstance(nodes, int) and isinstance(per_node, int) and nodes * per_node > MAX_RANKS:
        prefix = f"{where}: " if where else ""
        name = label or (lambda key: key)
        raise ConfigError(
            f"{prefix}{name('nodes')} x {name('ranks_per_node')}: {nodes} x {per_node} ranks are too many; "
            f"allowed: at most {MAX_RANKS} ranks"
        )
    if "time" not in data:
        return None
    try:
        return walltime.parse(data["time"])
    except ValueError as exc:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}{label('time') if label else 'time'}: {exc}") from exc


def from_mapping(data: Mapping[str, Any], where: str = "<job>") -> JobSpec:
    """A JobSpec from a parsed job document (validated by `check` first)."""
    time_s = check(data, where)
    steps: tuple[Step, ...] = ()
    if "command" in data:
        steps = (Step(command_argv(data["command"])),)
    elif "steps" in data:
        steps = tuple(Step(command_argv(s["run"]), s.get("name", "")) for s in data["steps"])
    return JobSpec(
        nodes=data.get("nodes", 1),
        name=data.get("name", "hpcring"),
        ranks=data.get("ranks"),
        ranks_per_node=data.get("ranks_per_node"),
        gpus_per_rank=data.get("gpus_per_rank"),
        cpus_per_rank=data.get("cpus_per_rank"),
        threads_per_core=data.get("threads_per_core"),
        time_s=time_s,
        partition=data.get("partition"),
        account=data.get("account"),
        output=data.get("output"),
        error=data.get("error"),
        workdir=data.get("workdir"),
        image=data.get("image"),
        binds=tuple(data.get("binds", [])),
        modules=tuple(data.get("modules", [])),
        env=tuple((k, _env_str(v)) for k, v in (data.get("env") or {}).items()),
        steps=steps,
        elastic=(
            (data["elastic"]["min_nodes"], data["elastic"].get("max_restarts", 3))
            if "elastic" in data
            else None
        ),
        gpu_aware_mpi=data.get("gpu_aware_mpi"),
        requeue=requeue.from_mapping(data["requeue"]) if data.get("requeue") not in (None, False) else None,
    )


def load(path: str | Path) -> JobSpec:
    """A JobSpec from a YAML job file (read as profiles are: a file that is not UTF-8 is one line)."""
    p = Path(path)
    text = textfile.read_text(p, "job file", ConfigError)
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a job file must be a mapping of keys (nodes, command or steps, ...)")
    return from_mapping(data, str(p))


def parse_env(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE pairs from repeated --env flags."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE with KEY a valid variable name")
        out.append((key, value))
    return tuple(out)


def override(spec: JobSpec, **changes: Any) -> JobSpec:
    """`spec` with the given fields replaced, ignoring None (flags not given keep the job file's value)."""
    given = {k: v for k, v in changes.items() if v is not None and v != ()}
    if "env" in given:
        given["env"] = (*[kv for kv in spec.env if kv[0] not in dict(given["env"])], *given["env"])
    return replace(spec, **given)


def steps_from_cli(command: Sequence[str], step_lines: Sequence[str]) -> tuple[Step, ...]:
    """Steps from the CLI: the argv after `--` (exact), or repeated --step "shell command" lines."""
    if command and step_lines:
        raise ConfigError("give either a command after '--' or --step lines, not both")
    if command:
        return (Step(tuple(command)),)
    return tuple(Step(command_argv(s)) for s in step_lines)


def describe(step: Step) -> str:
    """A step's command for logs and tables."""
    return step.name or shlex.join(step.argv)
