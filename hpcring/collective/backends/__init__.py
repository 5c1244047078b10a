"""Transport backends, registered by name and imported only when first used.

`mpi` is built in; the GPU helper's `nccl` registers itself the same way. A backend module exposes
`make_transport(comm) -> Transport`, where `comm` is whatever group handle that backend understands (an mpi4py
communicator for `mpi`).
"""

from __future__ import annotations

import importlib
from typing import Any

from hpcring.collective.backends.base import Request, Transport
from hpcring.errors import ConfigError, choices

__all__ = ["Request", "Transport", "available", "make_transport", "register"]

_REGISTRY: dict[str, str] = {
    "mpi": "hpcring.collective.backends.mpi",
    "nccl": "hpcring.collective.backends.nccl",
}


def register(name: str, module: str) -> None:
    """Add (or replace) a backend: `module` must define `make_transport(comm)`."""
    _REGISTRY[name] = module


def available() -> list[str]:
    """Registered backend names (registration does not mean importable)."""
    return sorted(_REGISTRY)


def make_transport(name: str, comm: Any) -> Transport:
    """A transport of backend `name` over `comm`; ConfigError listing the registered names when unknown."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown collective backend {name!r}; registered: {choices(sorted(_REGISTRY))}")
    module = importlib.import_module(_REGISTRY[name])
    transport: Transport = module.make_transport(comm)
    return transport
