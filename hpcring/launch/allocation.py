"""The hosts of the batch allocation this process runs in (Slurm, LSF, PBS), from the variables each sets.

`hpcring.run` called in an allocation without `hosts`/`hostfile` runs its ranks on the allocation's hosts:
the launcher must then be told them (its control socket listens for other hosts only when it knows of some).
Slurm: `SLURM_JOB_NODELIST` (`node[1-3,7]`), slots from `SLURM_TASKS_PER_NODE` (`2(x3),1`), else
`SLURM_JOB_CPUS_PER_NODE`; LSF: `LSB_MCPU_HOSTS` (`hostA 4 hostB 4`); PBS: `PBS_NODEFILE` (a line per slot).
Nothing here starts a process but `scontrol show hostnames` where Slurm's own tools are installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from hpcring.errors import ConfigError
from hpcring.launch.hosts import Host

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (`a[1-3,07]-ib,b`) as names, in order; zero padding is kept.

    One bracket per name (what Slurm prints for ordinary clusters); `scontrol show hostnames` is used
    instead where it is installed.
    """
    names: list[str] = []
    for item in _split_top(text):
        head, bracket, rest = item.partition("[")
        if not bracket:
            names.append(item)
            continue
        body, close, tail = rest.partition("]")
        if not close or "[" in tail:
            raise ConfigError(f"Slurm host list {text!r}: cannot expand {item!r}; pass hosts= explicitly")
        for part in body.split(","):
            m = _RANGE.match(part.strip())
            if m is None:
                raise ConfigError(f"Slurm host list {text!r}: {part!r} is not a number or a range")
            lo, hi = m.group(1), m.group(2) or m.group(1)
            names += [f"{head}{n:0{len(lo)}d}{tail}" for n in range(int(lo), int(hi) + 1)]
    return names


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts (`2(x3),1`) as one number per node."""
    counts: list[int] = []
    for part in text.split(","):
        count, _, rep = part.partition("(x")
        try:
            counts += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
        except ValueError:
            raise ConfigError(f"Slurm per-node count {text!r} is not like '2(x3),1'") from None
    return counts


def _slurm_names(nodelist: str) -> list[str]:
    if shutil.which("scontrol"):
        with_tool = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if with_tool.returncode == 0 and with_tool.stdout.split():
            return with_tool.stdout.split()
    return expand_hostlist(nodelist)


def _slurm(env: Mapping[str, str]) -> list[Host]:
    names = _slurm_names(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    per_node = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE")
    counts = expand_counts(per_node) if per_node else [1] * len(names)
    if len(counts) != len(names):
        raise ConfigError(
            f"Slurm allocation: {len(names)} nodes in SLURM_JOB_NODELIST but {len(counts)} counts in "
            f"{per_node!r}; pass hosts= explicitly"
        )
    return [Host(n, c) for n, c in zip(names, counts, strict=True)]


def _lsf(env: Mapping[str, str]) -> list[Host]:
    words = env["LSB_MCPU_HOSTS"].split()
    if len(words) % 2:
        raise ConfigError(f"LSB_MCPU_HOSTS={env['LSB_MCPU_HOSTS']!r} is not 'host slots host slots ...'")
    slots: dict[str, int] = {}
    for name, count in zip(words[::2], words[1::2], strict=True):
        slots[name] = slots.get(name, 0) + int(count)
    return [Host(n, c) for n, c in slots.items()]


def _pbs(env: Mapping[str, str]) -> list[Host]:
    path = env["PBS_NODEFILE"]
    try:
        lines = Path(path).read_text().split()
    except OSError as exc:
        raise ConfigError(f"PBS_NODEFILE {path!r} cannot be read: {exc.strerror or exc}") from None
    slots: dict[str, int] = {}
    for name in lines:
        slots[name] = slots.get(name, 0) + 1
    return [Host(n, c) for n, c in slots.items()]


def allocation_hosts(env: Mapping[str, str] | None = None) -> tuple[str, list[Host]] | None:
    """(scheduler, its hosts with slots) of the allocation this process runs in; None outside one."""
    e = os.environ if env is None else env
    if e.get("SLURM_JOB_NODELIST") or e.get("SLURM_NODELIST"):
        return "slurm", _slurm(e)
    if e.get("LSB_MCPU_HOSTS"):
        return "lsf", _lsf(e)
    if e.get("PBS_NODEFILE"):
        return "pbs", _pbs(e)
    return None
