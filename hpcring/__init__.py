"""hpcring: Horovod-compatible training for PyTorch 2.x, with Slurm, LSF, PBS Pro and Flux job scripts.

Importing this package never imports MPI, torch or CUDA: the collective API below is forwarded lazily to
`hpcring.collective`, so `import hpcring` works on a login node with none of them installed.
"""

from __future__ import annotations

import os
from typing import Any

from hpcring.version import __version__

# Names re-exported from hpcring.collective on first access.
_COLLECTIVE_API = frozenset(
    {
        "init",
        "shutdown",
        "is_initialized",
        "topology",
        "rank",
        "size",
        "local_rank",
        "local_size",
        "cross_rank",
        "cross_size",
        "is_homogeneous",
        "allreduce",
        "allgather",
        "broadcast",
        "alltoall",
        "reducescatter",
        "barrier",
        "ReduceOp",
    }
)

__all__ = ["__version__", "run", *sorted(_COLLECTIVE_API)]

# HPCRING_HOROVOD=1: `import horovod` resolves to hpcring in this process (hpcring/horovod_alias: why here).
if os.environ.get("HPCRING_HOROVOD"):
    from hpcring.horovod_alias.hook import install_from_env

    install_from_env()


def __getattr__(name: str) -> Any:
    if name in _COLLECTIVE_API:
        from hpcring import collective

        return getattr(collective, name)
    if name == "run":  # horovod.run: launches a job from Python (hpcring.cli.run_api)
        from hpcring.cli.run_api import run

        return run
    raise AttributeError(f"module 'hpcring' has no attribute {name!r}")
