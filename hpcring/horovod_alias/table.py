"""The table of `horovod` modules the alias answers: for each, the hpcring modules and names it forwards
to and what to say for the Horovod names hpcring lacks (`modules.py` builds the modules from it)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from hpcring.horovod_alias.missing import feature_missing

# The Horovod release whose API the alias mirrors (`horovod.__version__` for scripts that check it).
HOROVOD_API_VERSION = "0.28.1"

_LAUNCHER = "launch with `hpcring run -np N -- python script.py` (horovodrun's flags are accepted)"


@dataclass(frozen=True)
class Alias:
    """One `horovod` module: where its names come from and what to say for the ones hpcring lacks."""

    doc: str
    targets: tuple[str, ...] = ()  # hpcring modules whose names it forwards, first wins
    names: Mapping[str, str] = field(default_factory=dict)  # name -> "module:attribute", before targets
    missing: Mapping[str, str] = field(default_factory=dict)  # Horovod names hpcring lacks -> alternative
    values: Mapping[str, Callable[[], Any]] = field(default_factory=dict)  # name -> factory (run, version)


def _package() -> ModuleType:
    """hpcring itself: always in sys.modules while this module runs (a package is loaded before its
    submodules); reached there rather than imported, since hpcring imports this package's hook."""
    return sys.modules[__name__.partition(".")[0]]


def run(*args: Any, **kwargs: Any) -> Any:
    """`horovod.run` / `horovod.runner.run`: hpcring.run, looked up when called."""
    fn = getattr(_package(), "run", None)
    if not callable(fn):
        raise feature_missing(
            "horovod.runner",
            "run",
            "it needs hpcring.run, which this hpcring does not have; " + _LAUNCHER,
        )
    return fn(*args, **kwargs)


_UTIL = "hpcring.horovod_alias.common_util"
_RUN_VALUES: Mapping[str, Callable[[], Any]] = {"run": lambda: run}

TABLE: dict[str, Alias] = {
    "horovod": Alias(
        "Horovod's top-level package, answered by hpcring (hpcring.horovod_alias).",
        values={**_RUN_VALUES, "__version__": lambda: HOROVOD_API_VERSION},
    ),
    "horovod.torch": Alias(
        "horovod.torch, answered by hpcring.torch.",
        targets=("hpcring.torch",),
        names={"check_extension": f"{_UTIL}:check_extension"},
    ),
    "horovod.torch.mpi_ops": Alias(
        "horovod.torch.mpi_ops, answered by hpcring.torch.mpi_ops.",
        targets=("hpcring.torch.mpi_ops", "hpcring.torch", _UTIL),
    ),
    "horovod.torch.optimizer": Alias(
        "horovod.torch.optimizer, answered by hpcring.torch.",
        targets=("hpcring.torch.optimizer", "hpcring.torch", _UTIL),
    ),
    "horovod.torch.compression": Alias(
        "horovod.torch.compression, answered by hpcring.torch.compression.",
        targets=("hpcring.torch.compression",),
    ),
    "horovod.torch.functions": Alias(
        "horovod.torch.functions, answered by hpcring.torch.functions.",
        targets=("hpcring.torch.functions", "hpcring.torch"),
    ),
    "horovod.torch.sync_batch_norm": Alias(
        "horovod.torch.sync_batch_norm, answered by hpcring.torch.sync_batch_norm.",
        targets=("hpcring.torch.sync_batch_norm",),
    ),
    "horovod.torch.elastic": Alias(
        "horovod.torch.elastic, answered by hpcring.torch.elastic.",
        targets=("hpcring.torch.elastic", "hpcring.torch"),
        missing={"run_fn": "decorate the training function with hvd.elastic.run instead"},
    ),
    "horovod.torch.elastic.sampler": Alias(
        "horovod.torch.elastic.sampler, answered by hpcring.torch.elastic.sampler.",
        targets=("hpcring.torch.elastic.sampler", "hpcring.torch"),
    ),
    "horovod.torch.elastic.state": Alias(
        "horovod.torch.elastic.state, answered by hpcring.torch.elastic.state.",
        targets=("hpcring.torch.elastic.state", "hpcring.torch.elastic", "hpcring.torch"),
    ),
    "horovod.common": Alias("horovod.common, answered by hpcring."),
    "horovod.common.util": Alias("horovod.common.util, answered by hpcring.", targets=(_UTIL,)),
    "horovod.common.exceptions": Alias(
        "horovod.common.exceptions, answered by hpcring.",
        names={
            "HorovodInternalError": "hpcring.errors:CollectiveError",
            "HostsUpdatedInterrupt": "hpcring.torch.elastic.common:HostsUpdatedInterrupt",
            "HorovodVersionMismatchError": f"{_UTIL}:HorovodVersionMismatchError",
            "get_version_mismatch_message": f"{_UTIL}:get_version_mismatch_message",
        },
    ),
    "horovod.common.process_sets": Alias(
        "horovod.common.process_sets, answered by hpcring.",
        targets=("hpcring.engine.process_sets", "hpcring.torch.mpi_ops", _UTIL),
    ),
    "horovod.common.elastic": Alias(
        "horovod.common.elastic, answered by hpcring.torch.elastic.",
        targets=("hpcring.torch.elastic.common", "hpcring.torch.elastic"),
        missing={
            "run_fn": "decorate the training function with hvd.elastic.run instead",
            **dict.fromkeys(
                ("HostUpdateResult", "WorkerNotificationManager", "notification_manager"),
                "hpcring's launcher announces host changes itself and State.check_host_updates() raises "
                "HostsUpdatedInterrupt as Horovod's does (docs/guide/elastic.md)",
            ),
        },
    ),
    "horovod.runner": Alias(
        "horovod.runner, answered by hpcring: run is hpcring.run.",
        values=_RUN_VALUES,
        missing={"launch": _LAUNCHER, "_HorovodArgs": "pass horovod.run's keyword arguments to hpcring.run"},
    ),
    "horovod.runner.util": Alias("horovod.runner.util, answered by hpcring."),
    "horovod.runner.util.threads": Alias(
        "horovod.runner.util.threads, answered by hpcring.horovod_alias.threads.",
        targets=("hpcring.horovod_alias.threads",),
    ),
    "horovod.ray": Alias(
        "horovod.ray, answered by hpcring.ray (docs/guide/ray.md).",
        targets=("hpcring.ray",),
        names={
            "RayExecutor": "hpcring.ray.executor:RayExecutor",
            "ElasticRayExecutor": "hpcring.ray.elastic_executor:ElasticRayExecutor",
        },
        missing={
            "BaseHorovodWorker": "hpcring's Ray workers are its own MPI processes; pass executable_cls to "
            "RayExecutor.start() to build an object in each worker, as with Horovod",
        },
    ),
    "horovod.spark": Alias(
        "horovod.spark, answered by hpcring.spark (docs/guide/spark.md).",
        targets=("hpcring.spark",),
    ),
    "horovod.spark.torch": Alias(
        "horovod.spark.torch, answered by hpcring.spark.torch.", targets=("hpcring.spark.torch",)
    ),
    "horovod.spark.common": Alias("horovod.spark.common, answered by hpcring.spark.common."),
    "horovod.spark.common.backend": Alias(
        "horovod.spark.common.backend, answered by hpcring.spark.common.backend.",
        targets=("hpcring.spark.common.backend",),
    ),
    "horovod.spark.common.store": Alias(
        "horovod.spark.common.store, answered by hpcring.spark.common.store.",
        targets=("hpcring.spark.common.store",),
    ),
}

_PYTORCH_ONLY = (
    "hpcring supports PyTorch only: write the training script against horovod.torch "
    "(import horovod.torch as hvd), which hpcring answers"
)
# Horovod packages for frameworks hpcring does not support: importing one (or anything under it) raises.
UNAVAILABLE: dict[str, str] = {
    "horovod.tensorflow": _PYTORCH_ONLY,
    "horovod.keras": _PYTORCH_ONLY,
    "horovod._keras": _PYTORCH_ONLY,
    "horovod.mxnet": _PYTORCH_ONLY,
    "horovod.spark.keras": _PYTORCH_ONLY + "; on Spark, use horovod.spark.torch.TorchEstimator",
    "horovod.spark.tensorflow": _PYTORCH_ONLY + "; on Spark, use horovod.spark.torch.TorchEstimator",
    "horovod.spark.lightning": "hpcring has no Lightning estimator: use horovod.spark.torch.TorchEstimator "
    "with a plain torch.nn.Module (docs/guide/spark.md)",
}
