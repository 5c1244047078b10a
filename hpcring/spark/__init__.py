"""Horovod's Spark entry point (`horovod.spark.run`) over hpcring: `hpcring.spark.run(fn, num_proc=...)`.

Importing this package loads neither pyspark nor MPI; `run` imports pyspark when called (the `spark` extra:
`pip install 'hpcring[spark]'`). The tasks' workers need MPICH, as Ray's do (docs/guide/spark.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SparkJobFailed", "run"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from hpcring.spark.runner import run

        return run
    if name == "SparkJobFailed":
        from hpcring.spark.task import SparkJobFailed

        return SparkJobFailed
    raise AttributeError(f"module 'hpcring.spark' has no attribute {name!r}")
