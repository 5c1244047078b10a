"""`TorchEstimator`: Horovod's horovod.spark.torch estimator over hpcring.

`fit(df)` checks its parameters, writes the feature and label columns into the store as Parquet (one shard
per rank, `hpcring.spark.common.prepare`), trains on `num_proc` Spark tasks through `hpcring.spark.run`
(`hpcring.spark.torch.remote`) and returns a `TorchModel` holding the trained model, its optimizer and the
history. The model and the optimizer travel to the ranks in one pickle, so the optimizer keeps its
references to the model's parameters: `optimizer=torch.optim.SGD(model.parameters(), lr=0.1)` works as in
Horovod.
"""

from __future__ import annotations

import copy
import io
import time
from typing import Any

from pyspark.ml import Estimator

from hpcring.errors import ConfigError
from hpcring.spark.torch.checks import CHECKS, check_complete, check_value
from hpcring.spark.torch.model import TorchModel
from hpcring.spark.torch.params import add_params

__all__ = ["TorchEstimator", "TorchModel"]

DOCS = {
    "num_proc": "number of processes (default: the cluster's task slots)",
    "model": "the torch.nn.Module to train",
    "optimizer": "a torch.optim optimizer built on the model's parameters",
    "loss": "loss(output, label), or a list of them (one per label column)",
    "store": "the Store holding the prepared data and the runs",
    "feature_cols": "feature columns, one per argument of the model's forward()",
    "label_cols": "label columns, one per output of the model",
    "batch_size": "rows per step on each process",
    "val_batch_size": "rows per validation step on each process (default: batch_size)",
    "epochs": "number of epochs",
    "validation": "fraction of rows held out for validation, or the name of a boolean column",
    "run_id": "name of the run in the store (default: pytorch_<time>)",
    "shuffle": "shuffle each process's rows every epoch",
    "random_seed": "seed of torch and of the shuffles",
    "metrics": "metric functions metric(output, label), or lists of them (one per output)",
    "callbacks": "functions callback(epoch, history_entry) run on every rank after each epoch",
    "verbose": "0 (quiet), 1 or 2 (rank 0 prints each epoch's metrics)",
    "train_steps_per_epoch": "training steps per epoch (default: train rows // (batch_size * num_proc))",
    "validation_steps_per_epoch": (
        "validation steps per epoch (default: val rows // (val_batch_size * num_proc), at least 1)"
    ),
    "input_shapes": "the shape of each feature column's batch tensor (default: [-1, elements per row])",
    "backend": (
        "where the training runs: a Backend such as SparkBackend(num_proc) (default: hpcring.spark.run "
        "on num_proc tasks)"
    ),
    "backward_passes_per_step": (
        "batches whose gradients are accumulated (each loss divided by it) before one allreduce and "
        "optimizer step"
    ),
}
DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(DOCS),
    "batch_size": 32,
    "epochs": 1,
    "shuffle": True,
    "metrics": [],
    "callbacks": [],
    "verbose": 1,
    "backward_passes_per_step": 1,
}
# Horovod's parameters that hpcring's estimator does not implement: refused by name, never ignored.
UNSUPPORTED = (
    "data_module",
    "gradient_compression",
    "loss_weights",
    "loss_constructors",
    "sample_weight_col",
    "continuous_cols",
    "categorical_cols",
    "partitions_per_process",
    "train_minibatch_fn",
    "transformation_fn",
    "train_reader_num_workers",
    "val_reader_num_workers",
    "reader_pool_type",
    "label_shapes",
    "inmemory_cache_all",
    "use_gpu",
    "mp_start_method",
    "shuffle_buffer_size",
)


class TorchEstimator(Estimator):  # type: ignore[misc]
    """Spark ML Estimator training a PyTorch model with hpcring (parameters and names as Horovod's)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**DEFAULTS)
        self.setParams(**kwargs)

    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set several parameters by name; an unknown or unsupported name is refused."""
        for name in kwargs:
            if name in UNSUPPORTED:
                raise ConfigError(f"TorchEstimator: {name} is a Horovod parameter hpcring does not support")
            if name not in CHECKS:
                raise ConfigError(f"TorchEstimator: unknown parameter {name!r}; known: {', '.join(CHECKS)}")
        for name, value in kwargs.items():
            check_value(name, value)
        return self._set(**kwargs)  # type: ignore[no-any-return]

    def _values(self) -> dict[str, Any]:
        return {name: self.getOrDefault(name) for name in DOCS}

    def _fit(self, df: Any) -> TorchModel:
        from hpcring.spark.torch.fit import fit

        values = self._values()
        for name, value in values.items():
            check_value(name, value)
        check_complete(values)
        run_id = values["run_id"] or f"pytorch_{int(time.time())}"
        result, prepared = fit(df, values, run_id)
        return _model(values, result, prepared, run_id)


def _model(values: dict[str, Any], result: dict[str, Any], prepared: Any, run_id: str) -> TorchModel:
    """The TorchModel of a finished fit: copies of the user's model and optimizer (copied together, so the
    optimizer's references follow) loaded with rank 0's final state."""
    import torch

    model, optimizer = copy.deepcopy((values["model"], values["optimizer"]))
    state = torch.load(io.BytesIO(result["checkpoint"]), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    model.eval()
    return TorchModel(
        history=result["history"],
        model=model,
        optimizer=optimizer,
        feature_columns=list(values["feature_cols"]),
        label_columns=list(values["label_cols"]),
        input_shapes=[list(s) for s in result["input_shapes"]],
        run_id=run_id,
        _metadata={c: vars(col) for c, col in prepared.columns.items()},
    )


add_params(TorchEstimator, DOCS, check_value)
