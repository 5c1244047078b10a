"""Before Ray or Spark starts a worker: can the Python the workers will run import hpcring, and does its
mpi4py load MPICH?

Ray's actors and Spark's tasks start their processes themselves, so each worker forms the world afterwards,
which MPICH can do and Open MPI 5 cannot (docs/guide/ray.md, "Which MPI, and why"). Found inside a worker,
either problem surfaces as an error in a Ray or Java stack trace, after the actors or the Spark job started;
found here, on the driver, it is one line naming the Python and the fix. The driver asks that Python itself
(a subprocess with the workers' variables), since the flavour is a property of its environment (mpi4py's
wheel, MPI4PY_MPIABI, LD_LIBRARY_PATH), not of the driver's. A Python that does not exist on the driver's
machine is not checked: the workers' own checks remain (`hpcring.launch.rendezvous.check_support`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from hpcring.errors import ConfigError

# Prints one line: "hpcring-missing <error>", "mpi4py-missing <error>" or "mpi <library version line>".
_PROBE = """
import importlib, sys
try:
    for name in sys.argv[1:]:
        importlib.import_module(name)
except Exception as exc:
    print("hpcring-missing", f"{type(exc).__name__}: {exc}"); sys.exit(0)
try:
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
except Exception as exc:
    print("mpi4py-missing", f"{type(exc).__name__}: {exc}"); sys.exit(0)
print("mpi", (MPI.Get_library_version().strip().splitlines() or ["unknown MPI"])[0])
"""


@dataclass(frozen=True)
class WorkerPython:
    """What the workers' Python said about itself: `state` is "mpi", "hpcring-missing" or "mpi4py-missing"."""

    python: str
    state: str
    detail: str

    @property
    def is_mpich(self) -> bool:
        return self.state == "mpi" and "MPICH" in self.detail


def resolve(python: str) -> str | None:
    """`python` as a path on this machine (a bare name is looked up on PATH); None when it is not here."""
    if os.sep in python:
        return python if os.access(python, os.X_OK) else None
    return shutil.which(python)


def probe(python: str, env: Mapping[str, str], modules: tuple[str, ...]) -> WorkerPython | None:
    """Ask `python`, run with `env`, whether it imports `modules` and mpi4py, and which MPI mpi4py loads;
    None when `python` does not exist on this machine."""
    path = resolve(python)
    if path is None:
        return None
    return _probe(path, tuple(sorted(env.items())), modules)


@functools.lru_cache(maxsize=8)
def _probe(path: str, env: tuple[tuple[str, str], ...], modules: tuple[str, ...]) -> WorkerPython:
    try:
        proc = subprocess.run(
            [path, "-c", _PROBE, *modules],
            cwd="/",  # not the driver's folder, which `-c` would put on sys.path and a worker never has
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return WorkerPython(path, "hpcring-missing", f"it could not be run: {exc}")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return WorkerPython(path, "hpcring-missing", last)
    state, _, detail = lines[-1].partition(" ")
    return WorkerPython(path, state, detail)


def require_mpich(
    api: str, python: str, source: str, env: Mapping[str, str], modules: tuple[str, ...], fix: str
) -> None:
    """ConfigError, one line, unless the workers' `python` (chosen by `source`) imports hpcring's worker
    `modules` and loads MPICH; `fix` says how the user points the workers at another Python."""
    found = probe(python, env, modules)
    if found is None or found.is_mpich:
        return
    where = f"the workers' Python {found.python} ({source})"
    install = "pip install -c constraints.txt '.[torch,mpich,...]' in a clone: docs/guide/install.md"
    if found.state == "hpcring-missing":
        raise ConfigError(
            f"{api}: {where} cannot import hpcring's worker code ({found.detail}); install hpcring there "
            f"({install}) or {fix}"
        )
    if found.state == "mpi4py-missing":
        raise ConfigError(
            f"{api}: {where} cannot import mpi4py ({found.detail}); install the mpich extra there "
            f"({install}) or {fix}"
        )
    raise ConfigError(
        f"{api} needs MPICH in its workers, but {where} loads {found.detail}: use an environment installed "
        f"with the mpich extra ({install}) or {fix}; Open MPI 5 processes started by different launchers "
        "cannot form one world (docs/guide/ray.md#which-mpi-and-why)"
    )
