"""`TorchModel.transform`: the model runs on the executors over each partition in batches of rows."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

PREDICT_BATCH = 256


def _features(rows: list[Any], columns: list[str], shapes: list[list[int]]) -> list[Any]:
    """One float tensor per feature column of `rows` (Spark ML vectors made dense)."""
    import numpy as np
    import torch

    out = []
    for c, shape in zip(columns, shapes, strict=True):
        values = [r[c].toArray() if hasattr(r[c], "toArray") else r[c] for r in rows]
        out.append(torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(shape))
    return out


def predict_rows(model: Any, rows: list[Any], columns: list[str], shapes: list[list[int]]) -> list[list[Any]]:
    """Per output, one value per row: a float when the output has one element per row, else a list."""
    import torch

    with torch.no_grad():
        out = model(*_features(rows, columns, shapes))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    per_output = []
    for o in outs:
        flat = o.reshape(len(rows), -1).double()
        per_output.append([float(v[0]) if v.numel() == 1 else v.tolist() for v in flat])
    return per_output


def _partition(payload: bytes, columns: list[str], shapes: list[list[int]], vectors: list[bool]) -> Any:
    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        from pyspark.ml.linalg import DenseVector

        from hpcring import _deps

        model = _deps.require("cloudpickle").loads(payload)
        model.eval()
        rows = iter(rows)  # batches are taken as the rows stream in: a partition is never held whole
        while batch := list(itertools.islice(rows, PREDICT_BATCH)):
            preds = predict_rows(model, batch, columns, shapes)
            for i, r in enumerate(batch):
                values = [DenseVector(p[i]) if vec else p[i] for p, vec in zip(preds, vectors, strict=True)]
                yield (*r, *values)

    return run


def _output_type(sample: Any, label_kind: str) -> Any:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if label_kind == "vector":
        return VectorUDT()
    if isinstance(sample, list) or label_kind == "array":
        return T.ArrayType(T.DoubleType(), False)
    return T.DoubleType()


def transform(tm: Any, df: Any) -> Any:
    """`df` with the model's predictions in the output columns (an existing column of that name is
    replaced)."""
    from pyspark.sql import types as T

    from hpcring import _deps

    model, columns, shapes = tm.getModel(), tm.getFeatureColumns(), tm.getInputShapes()
    labels, outputs, meta = tm.getLabelColumns(), tm.getOutputCols(), tm.getOrDefault("_metadata") or {}
    kinds = [meta.get(c, {}).get("kind", "scalar") for c in labels]
    base = df.drop(*[c for c in outputs if c in df.columns])
    first = base.select(*columns).limit(1).collect()
    samples = predict_rows(model, first, columns, shapes) if first else [[None]] * len(outputs)
    fields = [
        T.StructField(name, _output_type(s[0], kind), True)
        for name, s, kind in zip(outputs, samples, kinds, strict=True)
    ]
    payload = _deps.require("cloudpickle").dumps(model)
    run = _partition(payload, columns, shapes, [k == "vector" for k in kinds])
    rdd = base.rdd.mapPartitions(run)
    return base.sparkSession.createDataFrame(rdd, T.StructType([*base.schema.fields, *fields]))
