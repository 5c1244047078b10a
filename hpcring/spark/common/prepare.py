"""The estimators' data preparation: the DataFrame's feature and label columns written as Parquet into the
store, so that each rank reads only its own shard (`hpcring.spark.common.shards`).

Rows are numbered in the DataFrame's order (`zipWithIndex`); row i goes to shard i % num_proc, written as
a Hive partition (`hpcring_shard=r/`) that keeps its row number. Rank r reads shard r in row order, so step s
of all ranks together covers rows [s*B*N, (s+1)*B*N) of the DataFrame: the same batches that one process
with batch size B*N sees. Spark ML vectors are written as arrays of doubles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcring.errors import ConfigError

ROW_COL = "hpcring_row"
SHARD_COL = "hpcring_shard"
VAL_COL = "hpcring_is_val"


@dataclass(frozen=True)
class Column:
    """One feature or label column as the ranks see it: `kind` scalar/array/vector, `dtype` float/int,
    `size` the elements per row (1 for scalars)."""

    name: str
    kind: str
    dtype: str
    size: int


@dataclass(frozen=True)
class Prepared:
    """What `prepare` wrote: the paths (full, as Spark names them), row counts, and the columns."""

    train_path: str
    val_path: str | None
    train_rows: int
    val_rows: int
    columns: dict[str, Column] = field(default_factory=dict)


def _kind(data_type: Any) -> tuple[str, str] | None:
    """(kind, dtype) of a Spark type the estimators accept, None for others."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType)
    if isinstance(data_type, VectorUDT):
        return "vector", "float"
    if isinstance(data_type, integral):
        return "scalar", "int"
    if isinstance(data_type, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "scalar", "float"
    if isinstance(data_type, T.ArrayType):
        inner = _kind(data_type.elementType)
        if inner is not None and inner[0] == "scalar":
            return "array", inner[1]
    return None


def describe(schema: Any, names: list[str], param: str) -> dict[str, tuple[str, str]]:
    """(kind, dtype) of each column in `names`; ConfigError naming `param` for a missing or bad one."""
    fields = {f.name: f.dataType for f in schema.fields}
    out = {}
    for name in names:
        if name not in fields:
            raise ConfigError(
                f"TorchEstimator: {param} names {name!r}, which is not a column of the DataFrame"
            )
        kind = _kind(fields[name])
        if kind is None:
            raise ConfigError(
                f"TorchEstimator: {param} column {name!r} has type "
                f"{fields[name].simpleString()}; allowed: numbers, arrays of numbers, Spark ML vectors"
            )
        out[name] = kind
    return out


def _validation_flag(df: Any, validation: str | float | None, seed: int | None) -> Any:
    """`df` with VAL_COL (True for validation rows), or `df` itself when there is no validation."""
    from pyspark.sql import functions as F

    if isinstance(validation, str):
        kind = _kind(dict((f.name, f.dataType) for f in df.schema.fields).get(validation))
        if validation not in df.columns or kind is None or kind[0] != "scalar":
            raise ConfigError(
                f"TorchEstimator: validation={validation!r} must name a boolean or 0/1 column of the "
                "DataFrame"
            )
        return df.withColumn(VAL_COL, F.coalesce(F.col(validation).cast("boolean"), F.lit(False)))
    if validation:
        return df.withColumn(VAL_COL, F.rand(0 if seed is None else seed) < float(validation))
    return df


def _sizes(df: Any, kinds: dict[str, tuple[str, str]]) -> tuple[int, int, dict[str, int]]:
    """(train rows, validation rows, elements per row of each column) in one job; a ragged array column
    is refused (a batch needs one shape)."""
    from pyspark.sql import functions as F

    arrays = [c for c, (k, _) in kinds.items() if k != "scalar"]
    aggs = [F.count(F.lit(1)).alias("rows")]
    aggs.append(
        F.sum(F.col(VAL_COL).cast("long")).alias("val") if VAL_COL in df.columns else F.lit(0).alias("val")
    )
    for c in arrays:
        aggs += [F.min(F.size(c)).alias(f"min_{c}"), F.max(F.size(c)).alias(f"max_{c}")]
    row = df.agg(*aggs).first()
    sizes = {c: 1 for c in kinds}
    for c in arrays:
        low, high = row[f"min_{c}"], row[f"max_{c}"]
        if low != high or low is None or low < 1:
            raise ConfigError(
                f"TorchEstimator: column {c!r} holds arrays of {low}..{high} elements; every row needs "
                "the same number (one tensor shape per batch)"
            )
        sizes[c] = int(low)
    val = int(row["val"] or 0)
    return int(row["rows"]) - val, val, sizes


def _write(df: Any, path: str, num_proc: int) -> None:
    """Number `df`'s rows in order and write them, partitioned by shard (row % num_proc)."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            *df.schema.fields,
            T.StructField(ROW_COL, T.LongType(), False),
            T.StructField(SHARD_COL, T.IntegerType(), False),
        ]
    )
    n = num_proc
    rows = df.rdd.zipWithIndex().map(lambda pair: (*pair[0], pair[1], pair[1] % n))
    spark = df.sparkSession
    spark.createDataFrame(rows, schema).write.mode("overwrite").partitionBy(SHARD_COL).parquet(path)


def prepare(
    df: Any,
    store: Any,
    feature_cols: list[str],
    label_cols: list[str],
    validation: str | float | None,
    num_proc: int,
    seed: int | None,
) -> Prepared:
    """Write `df`'s feature and label columns into `store` (train and validation) in num_proc shards."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    kinds = {
        **describe(df.schema, feature_cols, "feature_cols"),
        **describe(df.schema, label_cols, "label_cols"),
    }
    selected = [vector_to_array(F.col(c)).alias(c) if kinds[c][0] == "vector" else F.col(c) for c in kinds]
    flagged = _validation_flag(df, validation, seed)
    extra = [F.col(VAL_COL)] if VAL_COL in flagged.columns else []
    data = flagged.select(*selected, *extra).persist()
    try:
        train_rows, val_rows, sizes = _sizes(data, kinds)
        columns = {c: Column(c, kinds[c][0], kinds[c][1], sizes[c]) for c in kinds}
        if extra:
            _write(data.filter(~F.col(VAL_COL)).drop(VAL_COL), store.get_train_data_path(), num_proc)
            _write(data.filter(F.col(VAL_COL)).drop(VAL_COL), store.get_val_data_path(), num_proc)
        else:
            _write(data, store.get_train_data_path(), num_proc)
    finally:
        data.unpersist()
    val_path = store.get_val_data_path() if extra else None
    return Prepared(store.get_train_data_path(), val_path, train_rows, val_rows, columns)
