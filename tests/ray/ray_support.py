"""Helpers shared by tests/ray (importable by name: this folder is on the path; conftest files are not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def mpich_env() -> dict[str, str]:
    """Variables that make this interpreter's workers use MPICH; {} when it already does."""
    probe = "from mpi4py import MPI; print('MPICH' in MPI.Get_library_version())"
    uses_mpich = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if uses_mpich == "True":
        return {}
    py = Path(os.environ.get("HPCRING_TEST_MPICH_PYTHON") or ROOT / ".venv-mpich" / "bin" / "python")
    prefix = py.parent.parent
    if not (prefix / "bin" / "mpiexec").exists():
        pytest.skip(f"MPICH environment not found at {prefix} (run `make setup`)")
    return {
        "MPI4PY_MPIABI": "mpich",
        "LD_LIBRARY_PATH": str(prefix / "lib"),
        "HPCRING_RAY_MPIEXEC": str(prefix / "bin" / "mpiexec"),
    }
