"""A site's network stack for GPU collectives (`site.network` of a profile), as data, and what it adds to a
job: modules, batch directives, variables and library paths, and GPU-aware MPI only on request.

Why a block of its own: on HPE Slingshot, NCCL/RCCL reach the network only through an OFI plugin
(aws-ofi-nccl / aws-ofi-rccl) that the site installs its own way (a module, a directory, a container hook),
with variables each site documents; without it they fall back to TCP sockets. The generic interconnect
defaults (interconnect.py) are a guess; a profile that carries the site's block uses that instead.

GPU-aware MPI is separate on purpose: `MPICH_GPU_SUPPORT_ENABLED=1` makes Cray MPICH abort at start-up when
the program is not linked with its GPU transfer library (libmpi_gtl_*), and an mpi4py from pip is not. Its
variables are set only when the profile (`gpu_aware_mpi.enabled`) or the job (`gpu_aware_mpi: true`,
`--gpu-aware-mpi`) says the rank program links it; `hpcring doctor` says whether it does (diagnostics.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcring.errors import ConfigError, ProfileError, choices
from hpcring.schedulers.containers import check_host_path, expand
from hpcring.schedulers.model import Network, Site
from hpcring.schedulers.shell import Raw, check_line_safe, quote

# The schedulers whose batch scripts carry the block; a Kubernetes MPIJob has no module system or directives.
SCHEDULERS = ("slurm", "lsf", "pbs", "flux")


def _env(d: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    def text(v: object) -> str:
        return ("1" if v else "0") if isinstance(v, bool) else str(v)

    return tuple((k, text(v)) for k, v in (d or {}).items())


def from_profile(d: Mapping[str, Any] | None, scheduler: str, where: str) -> Network | None:
    """The Network of a schema-valid `site.network` mapping, with the checks a schema cannot make."""
    if d is None:
        return None
    field = f"{where}: site.network"
    if scheduler not in SCHEDULERS:
        raise ProfileError(
            f"{field}: the network block goes into batch scripts; scheduler {scheduler!r} has none; "
            f"allowed with: {choices(SCHEDULERS)}"
        )
    paths = tuple(check_host_path(p, f"{field}.library_paths") for p in d.get("library_paths", []))
    directives = tuple(check_line_safe(t, "site.network.directives entry") for t in d.get("directives", []))
    env = _env(d.get("env"))
    if any(k == "LD_LIBRARY_PATH" for k, _ in env):
        raise ProfileError(f"{field}.env.LD_LIBRARY_PATH: give the directories in library_paths instead")
    gpu = d.get("gpu_aware_mpi") or {}
    gpu_env = _env(gpu.get("env"))
    if gpu.get("enabled", False) and not gpu_env:
        raise ProfileError(f"{field}.gpu_aware_mpi.enabled: true, but gpu_aware_mpi.env sets nothing")
    return Network(
        modules=tuple(d.get("modules", [])),
        env=env,
        library_paths=paths,
        directives=directives,
        gpu_aware_env=gpu_env,
        gpu_aware_mpi=bool(gpu.get("enabled", False)),
    )


def gpu_aware(site: Site, profile_name: str, requested: bool | None) -> bool:
    """Whether a job sets the GPU-aware MPI variables: the job's word, else the profile's default. A job
    asking for it on a profile that documents none is refused (nothing to set)."""
    net = site.network
    if requested and (net is None or not net.gpu_aware_env):
        raise ConfigError(
            f"gpu_aware_mpi: profile {profile_name!r} gives no GPU-aware MPI variables "
            "(site.network.gpu_aware_mpi.env); set them with --env instead, or drop --gpu-aware-mpi"
        )
    if net is None:
        return False
    return net.gpu_aware_mpi if requested is None else requested


def library_path(dirs: Sequence[str]) -> Raw:
    """`LD_LIBRARY_PATH` with `dirs` first and the inherited value kept after them (if any): literals
    quoted, `${NAME}` expanded by the job's shell, safe under `set -u`."""
    words = [str(expand(d)) for d in dirs]
    head = ":".join(words) if words else quote("")
    return Raw(head + '"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"')


def job_env(site: Site, uses_gpus: bool, gpu_aware_mpi: bool) -> tuple[bool, list[tuple[str, str]]]:
    """(whether the block replaces the interconnect's defaults, its variables) for a job: the stack's
    variables and library paths for GPU ranks, then the GPU-aware MPI ones when asked for."""
    net = site.network
    if net is None or not uses_gpus:
        return False, []
    env: list[tuple[str, str]] = list(net.env)
    if net.library_paths:
        env.append(("LD_LIBRARY_PATH", library_path(net.library_paths)))
    if gpu_aware_mpi:
        env += list(net.gpu_aware_env)
    return bool(net.modules or net.env or net.library_paths), env


def modules(site: Site, uses_gpus: bool) -> tuple[str, ...]:
    """Modules the block loads (after the site's), for GPU jobs."""
    return site.network.modules if site.network is not None and uses_gpus else ()


def directives(site: Site, uses_gpus: bool) -> tuple[str, ...]:
    """Batch directives the block adds, for GPU jobs."""
    return site.network.directives if site.network is not None and uses_gpus else ()
