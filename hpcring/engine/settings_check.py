"""Start-up check that the settings deciding what goes over the wire are the same on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcring.config import EngineSettings
from hpcring.errors import ConfigError


def check_settings_agree(comm: Any, settings: EngineSettings, collective: Sequence[tuple[str, Any]]) -> None:
    """ConfigError on every rank when ranks were started with different values of a setting that decides
    what goes over the wire (a launcher that forwards only some variables, a per-rank wrapper script): a
    different fusion threshold plans different batches, a different cache capacity gives the same bit other
    names, a different algorithm or chunk runs different message patterns: a hang or a wrong result later.
    `collective`: the collective floor's own such settings (`kernels.wire_settings`). (The device route is
    not here: it is part of every signature, so validation names it.)"""
    mine = (
        ("HPCRING_FUSION_THRESHOLD", settings.fusion_threshold),
        ("HPCRING_CACHE_CAPACITY", settings.cache_capacity),
        ("HPCRING_ALLREDUCE_ALGORITHM", settings.allreduce_algorithm),
        ("HPCRING_DEVICE_CROSS", settings.device_cross),
        ("HPCRING_NUM_NCCL_STREAMS", settings.num_streams),
        *collective,
    )
    every: list[tuple[tuple[str, Any], ...]] = comm.allgather(tuple(mine))
    for (var, _), column in zip(mine, zip(*every, strict=True), strict=True):
        values = [value for _, value in column]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            raise ConfigError(
                f"{var} differs between ranks ({per_rank}); every rank must use the same value (HOROVOD_* "
                "aliases included): set it in the environment the launcher gives every rank"
            )
