"""The `ray` module, imported on first use (it is an optional extra), typed as Any for mypy --strict."""

from __future__ import annotations

import importlib
from typing import Any

from hpcring.errors import BackendUnavailable


def ray_module() -> Any:
    """`ray`, or BackendUnavailable naming the extra that installs it."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise BackendUnavailable("ray", "pip install 'hpcring[ray]'", str(exc)) from exc


def ray_submodule(name: str) -> Any:
    """A submodule of ray, e.g. 'util.placement_group'."""
    ray_module()
    return importlib.import_module(f"ray.{name}")
