"""`TorchModel`: the Spark ML Model that `TorchEstimator.fit` returns (Horovod's horovod.spark.torch).

`transform(df)` runs the trained model on the executors, in batches per partition, and adds one output
column per label (default `<label>__output`): a double where the model gives one value per row, otherwise
an array of doubles (a Spark ML vector where the label was one). It saves and loads as Spark ML models do,
alone or as a stage of a `PipelineModel`: the JSON-able parameters go into Spark's metadata file, the model
and optimizer (pickled together) into a pickle file beside it, through Spark's own I/O.
"""

from __future__ import annotations

import os
from typing import Any

from pyspark.ml import Model
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from hpcring.spark.torch.params import add_params

DOCS = {
    "history": "one entry per epoch: the averaged training (and validation) loss and metrics",
    "model": "the trained torch.nn.Module",
    "optimizer": "the optimizer with its trained state (learning rate as given)",
    "feature_columns": "feature columns, one per argument of the model's forward()",
    "label_columns": "label columns, one per output of the model",
    "input_shapes": "the shape of each feature column's batch tensor",
    "run_id": "the run's name in the store",
    "output_cols": "the prediction columns transform adds, one per label column",
    "_metadata": "the kind, element type and size of each feature and label column",
}
# Saved in the metadata file; the model and optimizer go into the pickle file.
JSON_PARAMS = (
    "history",
    "feature_columns",
    "label_columns",
    "input_shapes",
    "run_id",
    "output_cols",
    "_metadata",
)


class TorchModel(Model, MLWritable, MLReadable):  # type: ignore[misc]
    """Spark Transformer wrapping a trained PyTorch model; `getModel()` gives the torch module."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**dict.fromkeys(DOCS))
        labels = kwargs.get("label_columns")
        if labels and "output_cols" not in kwargs:
            kwargs["output_cols"] = [f"{c}__output" for c in labels]
        self._set(**kwargs)

    def setParams(self, **kwargs: Any) -> TorchModel:
        return self._set(**kwargs)  # type: ignore[no-any-return]

    def _transform(self, df: Any) -> Any:
        from hpcring.spark.torch.predict import transform

        return transform(self, df)

    def write(self) -> MLWriter:
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader:
        return _Reader(cls)


class _Writer(MLWriter):  # type: ignore[misc]
    def __init__(self, instance: TorchModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from hpcring import _deps

        cloudpickle = _deps.require("cloudpickle")
        extra = {name: self.instance.getOrDefault(name) for name in JSON_PARAMS}
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, extraMetadata=extra, paramMap={}
        )
        payload = cloudpickle.dumps(
            {"model": self.instance.getModel(), "optimizer": self.instance.getOptimizer()}
        )
        sc = self.sparkSession.sparkContext
        sc.parallelize([payload], 1).saveAsPickleFile(os.path.join(path, "torch"))


class _Reader(MLReader):  # type: ignore[misc]
    def __init__(self, cls: type[TorchModel]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TorchModel:
        from hpcring import _deps

        cloudpickle = _deps.require("cloudpickle")
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        (payload,) = self.sparkSession.sparkContext.pickleFile(os.path.join(path, "torch")).collect()
        objects = cloudpickle.loads(payload)
        model = self.cls(model=objects["model"], optimizer=objects["optimizer"])
        model._set(**{name: metadata[name] for name in JSON_PARAMS})
        model._resetUid(metadata["uid"])
        return model


add_params(TorchModel, DOCS)
