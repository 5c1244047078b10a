"""Horovod's Ray integration (`horovod.ray`): `RayExecutor` and `ElasticRayExecutor` over hpcring.

Importing this package loads neither Ray nor MPI; the executors import Ray when created (the `ray` extra:
`pip install 'hpcring[ray]'`). The workers need MPICH (docs/guide/ray.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ElasticRayExecutor", "RayExecutor"]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from hpcring.ray.executor import RayExecutor

        return RayExecutor
    if name == "ElasticRayExecutor":
        from hpcring.ray.elastic_executor import ElasticRayExecutor

        return ElasticRayExecutor
    raise AttributeError(f"module 'hpcring.ray' has no attribute {name!r}")
