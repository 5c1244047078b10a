"""`site.pbs` and `site.flux` of a profile (schema v2) into their frozen options, with the checks a schema
cannot make (the mpiexec flavour must fit the site's MPI)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcring.errors import ProfileError, choices
from hpcring.schedulers.model import FluxOptions, PbsOptions

MPIEXEC_FLAVOURS = ("pals", "hydra")
# PALS is Cray's launcher: it starts Cray MPICH ranks; hydra is MPICH's own and serves every MPICH-ABI MPI.
_PALS_MPIS = ("cray-mpich", "mpich")


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pbs(d: Mapping[str, Any], mpi: str, where: str) -> PbsOptions:
    """PbsOptions from a schema-valid `site.pbs` mapping."""
    flavour = d.get("mpiexec")
    if flavour == "pals" and mpi not in _PALS_MPIS:
        raise ProfileError(
            f"{where}: site.pbs.mpiexec: 'pals' starts Cray MPICH ranks, but site.mpi is {mpi!r}; "
            f"allowed with pals: {choices(_PALS_MPIS)}"
        )
    return PbsOptions(
        mpiexec=flavour,
        place=d.get("place", "scatter"),
        filesystems=tuple(d.get("filesystems", [])),
        ncpus=None if d.get("ncpus", True) is True else d["ncpus"],
        ngpus=d.get("ngpus", True),
        select=tuple((k, _scalar(v)) for k, v in (d.get("select") or {}).items()),
        keep=d.get("keep"),
        extra_directives=tuple(d.get("extra_directives", [])),
    )


def flux(d: Mapping[str, Any], where: str) -> FluxOptions:
    """FluxOptions from a schema-valid `site.flux` mapping."""
    exclusive = d.get("exclusive", True)
    for key in ("cpu_affinity", "gpu_affinity"):
        if d.get(key) == "map" and not exclusive:
            raise ProfileError(
                f"{where}: site.flux.{key}: 'map' binds ranks to the mapping's devices, which only an "
                "exclusive node is sure to hold; set site.flux.exclusive: true or use 'per-task'"
            )
    return FluxOptions(
        exclusive=exclusive,
        setattr=tuple((k, _scalar(v)) for k, v in (d.get("setattr") or {}).items()),
        cpu_affinity=d.get("cpu_affinity", "per-task"),
        gpu_affinity=d.get("gpu_affinity", "per-task"),
        extra_directives=tuple(d.get("extra_directives", [])),
    )


def mpiexec_flavour(options: PbsOptions, mpi: str) -> str:
    """The site's mpiexec: as configured, else PALS for Cray MPICH and hydra otherwise."""
    if options.mpiexec is not None:
        return options.mpiexec
    return "pals" if mpi == "cray-mpich" else "hydra"
