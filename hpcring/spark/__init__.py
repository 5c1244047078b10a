"""Horovod's Spark entry points (`horovod.spark.run`, `run_elastic`) over hpcring:
`hpcring.spark.run(fn, num_proc=...)`, `hpcring.spark.run_elastic(fn, num_proc=..., min_np=...)`.

Importing this package loads neither pyspark nor MPI; `run` and `run_elastic` import pyspark when called
(the `spark` extra: `pip install 'hpcring[spark]'`). The tasks' workers need MPICH, as Ray's do
(docs/guide/spark.md).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SparkJobFailed", "run", "run_elastic"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from hpcring.spark.runner import run

        return run
    if name == "run_elastic":
        from hpcring.spark.elastic import run_elastic

        return run_elastic
    if name == "SparkJobFailed":
        from hpcring.spark.task import SparkJobFailed

        return SparkJobFailed
    raise AttributeError(f"module 'hpcring.spark' has no attribute {name!r}")
