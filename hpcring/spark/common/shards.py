"""A rank's view of the data that `hpcring.spark.common.prepare` wrote: its own shard, in row order, read
with pyarrow into numpy arrays (one per column: shape [rows] for scalars, [rows, size] for arrays)."""

from __future__ import annotations

import os
from typing import Any

from hpcring import _deps
from hpcring.errors import ConfigError
from hpcring.spark.common.prepare import ROW_COL, SHARD_COL


def shard_dir(localized_path: str, shard: int) -> str:
    return os.path.join(localized_path, f"{SHARD_COL}={shard}")


def read_shard(localized_path: str, shard: int, columns: list[str]) -> dict[str, Any]:
    """Columns `columns` of shard `shard` under `localized_path`, rows in the DataFrame's order."""
    pq = _deps.require("pyarrow.parquet")
    np = _deps.require("numpy")
    folder = shard_dir(localized_path, shard)
    if not os.path.isdir(folder):
        raise ConfigError(f"no rows for rank {shard} under {localized_path}: fewer rows than processes")
    table = pq.read_table(folder, columns=[*columns, ROW_COL])
    table = table.sort_by(ROW_COL)
    out = {}
    for name in columns:
        column = table.column(name).combine_chunks()
        if hasattr(column, "flatten") and hasattr(column, "value_lengths"):
            values = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = values.reshape(len(column), -1) if len(column) else values.reshape(0, 0)
        else:
            out[name] = np.asarray(column.to_numpy(zero_copy_only=False))
    return out
