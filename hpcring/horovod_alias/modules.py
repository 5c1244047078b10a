"""The `horovod` modules the alias answers with, each forwarding to hpcring's (the table below).

An alias module is a thin `ModuleType` that looks names up, on first use, in its hpcring modules
(`targets`, first wins) after its own `names`; a Horovod submodule is reached as an attribute too, as
Horovod scripts do (`hvd.elastic`). Forwarding instead of handing out hpcring's modules themselves keeps a
missing name's error Horovod's (`HorovodFeatureMissing`), while the objects (functions, classes, the
engine state behind them) are hpcring's own: `horovod.torch.allreduce is hpcring.torch.allreduce`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from hpcring.horovod_alias.missing import DOCS, HorovodFrameworkUnavailable, feature_missing

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


def _resolve(ref: str) -> Any:
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


class AliasModule(ModuleType):
    """A `horovod` module forwarding to hpcring's; names are looked up on first use and then kept."""

    _alias: Alias
    __all__: list[str]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in self._alias.values:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = self._lookup(name)
        setattr(self, name, value)
        return value

    def _lookup(self, name: str) -> Any:
        alias = self._alias
        child = f"{self.__name__}.{name}"
        if child in TABLE or child in UNAVAILABLE:
            return importlib.import_module(child)
        if name in alias.values:
            return alias.values[name]()
        if name in alias.names:
            return _resolve(alias.names[name])
        for target in alias.targets:
            module = importlib.import_module(target)
            try:
                return getattr(module, name)
            except AttributeError:
                continue
        instead = alias.missing.get(name)
        if instead is None:
            close = difflib.get_close_matches(name, _public(alias), n=3)
            if close:
                instead = f"the closest names it has are {', '.join(close)} ({DOCS})"
        raise feature_missing(self.__name__, name, instead)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_public(self._alias)})


def _public(alias: Alias) -> list[str]:
    """The names `from horovod.x import *` brings: the targets' `__all__` and the alias's own names."""
    out = [n for n in (*alias.names, *alias.values) if not n.startswith("_")]
    for target in alias.targets:
        out += list(getattr(importlib.import_module(target), "__all__", ()))
    return list(dict.fromkeys(out))


class AliasLoader(importlib.abc.Loader):
    """Builds the alias module for a spec."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = AliasModule(spec.name, TABLE[spec.name].doc)
        module._alias = TABLE[spec.name]
        return module

    def exec_module(self, module: ModuleType) -> None:
        assert isinstance(module, AliasModule)
        module.__all__ = _public(module._alias)


_LOADER = AliasLoader()


def spec_for(fullname: str) -> importlib.machinery.ModuleSpec:
    """The spec of `horovod...` `fullname`; an ImportError naming the Horovod module hpcring lacks."""
    for prefix, instead in UNAVAILABLE.items():
        if fullname == prefix or fullname.startswith(prefix + "."):
            raise HorovodFrameworkUnavailable(
                f"Horovod's {prefix} is not provided by hpcring; {instead}", name=fullname
            )
    if fullname not in TABLE:
        raise ModuleNotFoundError(
            f"Horovod's module {fullname} is not provided by hpcring's horovod alias; the modules it "
            f"answers are {', '.join(sorted(TABLE))} (see {DOCS})",
            name=fullname,
        )
    return importlib.machinery.ModuleSpec(
        fullname, _LOADER, origin=f"hpcring alias of {fullname}", is_package=True
    )
