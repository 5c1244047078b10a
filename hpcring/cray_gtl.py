"""`hpcring doctor` on a Cray node: does the loaded mpi4py's MPI link Cray MPICH's GPU transfer library?

Why: with `MPICH_GPU_SUPPORT_ENABLED=1`, Cray MPICH aborts at start-up unless the program is linked with its
GPU Transport Layer, libmpi_gtl_* (OLCF's Frontier guide, "MPICH_GPU_SUPPORT_ENABLED": "The library
libmpi_gtl_hsa.so must also be linked in, otherwise Cray MPICH will print an error message and exit
immediately"). An mpi4py from pip is not linked with it, so hpcring sets the variable only on request
(`--gpu-aware-mpi`, hpcring/schedulers/network.py) and this check tells whether the request is safe.

The objects looked at are the ones this process loaded (from /proc/self/maps, after mpi4py.MPI was imported
without MPI_Init): mpi4py's MPI extension module and every libmpi*. Their DT_NEEDED entries (elf_needed.py)
say whether they link libmpi_gtl_*; a GTL library already mapped (LD_PRELOAD, as OLCF's container example
does) counts too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcring import elf_needed

GTL_PREFIX = "libmpi_gtl_"
CRAY_VARS = ("CRAY_MPICH_DIR", "PE_ENV")
CRAY_DIR = "/opt/cray"


@dataclass
class GtlReport:
    """What the check found; `linked` is None when it could not tell."""

    cray: str | None  # why this looks like a Cray node (None: not one, the check is skipped)
    objects: dict[str, tuple[str, ...]] = field(default_factory=dict)  # path -> its DT_NEEDED
    gtl: list[str] = field(default_factory=list)  # "libmpi_gtl_hsa.so.0 (needed by PATH)" or "(loaded)"
    errors: list[str] = field(default_factory=list)
    gpu_support_env: str | None = None  # MPICH_GPU_SUPPORT_ENABLED as this process sees it

    @property
    def linked(self) -> bool | None:
        if self.gtl:
            return True
        return None if not self.objects else False


def cray_node(env: Mapping[str, str], root: Path = Path("/")) -> str | None:
    """Why this is a Cray programming environment node, or None."""
    for var in CRAY_VARS:
        if env.get(var):
            return f"{var}={env[var]}"
    cray = root / CRAY_DIR.lstrip("/")
    return f"{CRAY_DIR} exists" if cray.is_dir() else None


def mapped_objects(maps_text: str) -> list[str]:
    """Distinct file paths of a /proc/PID/maps text, in first-seen order."""
    paths: dict[str, None] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.setdefault(parts[5].removesuffix(" (deleted)"), None)
    return list(paths)


def _is_candidate(path: str) -> bool:
    name = os.path.basename(path)
    in_mpi4py = os.path.basename(os.path.dirname(path)) == "mpi4py" and name.startswith("MPI.")
    return in_mpi4py or name.startswith("libmpi")


def check(paths: list[str], env: Mapping[str, str], cray: str | None) -> GtlReport:
    """The report for the loaded objects `paths` (mpi4py's MPI module and the libmpi* among them)."""
    report = GtlReport(cray=cray, gpu_support_env=env.get("MPICH_GPU_SUPPORT_ENABLED"))
    for path in paths:
        if os.path.basename(path).startswith(GTL_PREFIX):
            report.gtl.append(f"{os.path.basename(path)} (loaded: {path})")
            continue
        if not _is_candidate(path):
            continue
        try:
            needed = elf_needed.read(path).needed
        except elf_needed.ElfError as exc:
            report.errors.append(str(exc))
            continue
        report.objects[path] = needed
        report.gtl += [f"{n} (needed by {path})" for n in needed if n.startswith(GTL_PREFIX)]
    return report


def probe(env: Mapping[str, str] | None = None, maps: Path = Path("/proc/self/maps")) -> GtlReport:
    """The check for this process (call after importing mpi4py.MPI); skipped off Cray nodes."""
    env = os.environ if env is None else env
    cray = cray_node(env)
    if cray is None:
        return GtlReport(cray=None)
    try:
        text = maps.read_text()
    except OSError as exc:
        return GtlReport(cray=cray, errors=[f"{maps}: {exc.strerror or exc}"])
    return check(mapped_objects(text), env, cray)


def advice(r: GtlReport) -> str | None:
    """The line for `missing:` when MPICH_GPU_SUPPORT_ENABLED=1 meets a program without GTL, else None."""
    if r.cray is None or r.linked is not False or r.gpu_support_env != "1":
        return None
    return (
        "MPICH_GPU_SUPPORT_ENABLED=1 is set but mpi4py's MPI does not link libmpi_gtl_*: Cray MPICH will "
        "abort at start. Unset it (hpcring sets it only with --gpu-aware-mpi), or build mpi4py with Cray's "
        "compiler wrapper and the GTL library (${PE_MPICH_GTL_DIR_<accel>} ${PE_MPICH_GTL_LIBS_<accel>}, "
        "OLCF's Frontier guide, GPU-aware MPI)"
    )


def summary(r: GtlReport) -> str:
    """One line for the text report."""
    if r.cray is None:
        return "not a Cray node (no CRAY_MPICH_DIR, PE_ENV or /opt/cray): check skipped"
    if r.linked is None:
        why = "; ".join(r.errors) or "mpi4py's MPI module and libmpi are not loaded"
        return f"Cray node ({r.cray}); cannot tell: {why}"
    if r.linked:
        return (
            f"Cray node ({r.cray}); GPU transfer library linked: {', '.join(r.gtl)}; --gpu-aware-mpi is safe"
        )
    names = ", ".join(os.path.basename(p) for p in r.objects)
    return (
        f"Cray node ({r.cray}); no libmpi_gtl_* in {names}: do not set MPICH_GPU_SUPPORT_ENABLED=1 "
        "(no --gpu-aware-mpi)"
    )
