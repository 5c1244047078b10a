"""The built-in schedulers and launchers by name: the one module that imports them all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from hpcring.errors import ConfigError, choices
from hpcring.schedulers.flux_batch import Flux
from hpcring.schedulers.interfaces import Launcher, Scheduler
from hpcring.schedulers.kubernetes_batch import Kubernetes
from hpcring.schedulers.launchers.flux_run import FluxRun
from hpcring.schedulers.launchers.jsrun import Jsrun
from hpcring.schedulers.launchers.mpiexec import Mpiexec
from hpcring.schedulers.launchers.mpirun import Mpirun
from hpcring.schedulers.launchers.srun import Srun
from hpcring.schedulers.lsf_batch import Lsf
from hpcring.schedulers.pbs_batch import Pbs
from hpcring.schedulers.slurm_batch import Slurm

SCHEDULERS: Mapping[str, type[Scheduler]] = {c.name: c for c in (Slurm, Lsf, Pbs, Flux, Kubernetes)}
LAUNCHERS: Mapping[str, type[Launcher]] = {c.name: c for c in (Srun, Jsrun, Mpirun, Mpiexec, FluxRun)}

_T = TypeVar("_T")


def _create(kind: str, table: Mapping[str, type[_T]], name: str) -> _T:
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; allowed: {choices(sorted(table))}")
    return table[name]()


def scheduler(name: str) -> Scheduler:
    return _create("scheduler", SCHEDULERS, name)


def launcher(name: str) -> Launcher:
    return _create("launcher", LAUNCHERS, name)
