"""Stand-ins for batch tools that cannot run here (PBS's qsub/qstat, PALS/hydra mpiexec, Flux), each behaving
as its documentation says; `install(bin_dir)` puts them on a PATH."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = {"qsub": "qsub", "qstat": "qstat", "mpiexec": "mpiexec", "flux": "flux"}


def install(bin_dir: Path) -> None:
    """Executable shims in `bin_dir` that run each stand-in with this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool, module in TOOLS.items():
        shim = bin_dir / tool
        target = shlex.quote(str(HERE / f"{module}.py"))
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {target} "$@"\n')
        shim.chmod(0o755)
