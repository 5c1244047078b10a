"""Horovod's `horovod.spark.torch`: `TorchEstimator` trains a PyTorch model on a Spark DataFrame over
hpcring and returns a `TorchModel`. pyspark and torch load when a name is first used."""

from __future__ import annotations

from typing import Any

__all__ = ["TorchEstimator", "TorchModel"]


def __getattr__(name: str) -> Any:
    if name == "TorchEstimator":
        from hpcring.spark.torch.estimator import TorchEstimator

        return TorchEstimator
    if name == "TorchModel":
        from hpcring.spark.torch.model import TorchModel

        return TorchModel
    raise AttributeError(f"module 'hpcring.spark.torch' has no attribute {name!r}")
