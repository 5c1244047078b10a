"""The checks of `TorchEstimator`'s parameters: a bad value is a ConfigError naming the parameter and what
it accepts, raised when it is set (or at fit, for what depends on other parameters) and so before any Spark
job starts. Free of pyspark, so that they can be tested on their own."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hpcring.errors import ConfigError

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _refuse(name: str, allowed: str, value: Any) -> ConfigError:
    return ConfigError(f"TorchEstimator: {name} must be {allowed}, got {value!r}")


def _positive_int(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(name, "a positive integer" + (" or None" if optional else ""), value)


def _column_list(name: str, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(c, str) and c for c in value):
        raise _refuse(name, "a non-empty list of column names", value)
    if len(set(value)) != len(value):
        raise _refuse(name, "a list of distinct column names", value)


def _callables(name: str, value: Any, nested: bool) -> None:
    """A list of callables; with `nested`, each entry may also be a list of callables (Horovod's metric
    groups: one function for every output, or one per output)."""
    ok = isinstance(value, (list, tuple)) and all(
        callable(v) or (nested and isinstance(v, (list, tuple)) and v and all(callable(f) for f in v))
        for v in value
    )
    if not ok:
        shape = (
            "a list whose entries are callables or lists of callables" if nested else "a list of callables"
        )
        raise _refuse(name, shape, value)


def check_validation(value: Any) -> None:
    if value is None or (isinstance(value, str) and value):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise _refuse("validation", "a fraction in [0, 1) of rows to hold out, a column name, or None", value)


def check_input_shapes(value: Any) -> None:
    def is_shape(s: Any) -> bool:
        return (
            isinstance(s, (list, tuple))
            and bool(s)
            and all(
                isinstance(d, int) and not isinstance(d, bool) and (d > 0 or (d == -1 and i == 0))
                for i, d in enumerate(s)
            )
        )

    if value is not None and not (isinstance(value, (list, tuple)) and value and all(map(is_shape, value))):
        raise _refuse(
            "input_shapes",
            "None or a list of shapes, one per feature column (e.g. [[-1, 4]]; -1 first only)",
            value,
        )


def _check_model(value: Any) -> None:
    import torch

    if value is not None and not isinstance(value, torch.nn.Module):
        raise _refuse("model", "a torch.nn.Module", value)


def _check_optimizer(value: Any) -> None:
    import torch

    if value is not None and not isinstance(value, torch.optim.Optimizer):
        raise _refuse("optimizer", "a torch.optim.Optimizer built on the model's parameters", value)


def _check_loss(value: Any) -> None:
    if value is None or callable(value):
        return
    if not (isinstance(value, (list, tuple)) and value and all(map(callable, value))):
        raise _refuse("loss", "a callable loss(output, label) or a list of them, one per label column", value)


def _check_store(value: Any) -> None:
    from hpcring.spark.common.store import Store

    if value is not None and not isinstance(value, Store):
        raise _refuse("store", "a Store (hpcring.spark.common.store.Store.create(prefix_path))", value)


def _check_bool(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, bool):
            raise _refuse(name, "True or False", value)

    return check


def _check_backend(value: Any) -> None:
    """Horovod's Backend interface: run(fn, args=..., env=...) and num_processes()."""
    if value is not None and not all(callable(getattr(value, m, None)) for m in ("run", "num_processes")):
        raise _refuse(
            "backend",
            "None or a Backend with run() and num_processes() (horovod.spark.common.backend.SparkBackend)",
            value,
        )


def _check_seed(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _refuse("random_seed", "an integer or None", value)


def _check_verbose(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, 2):
        raise _refuse("verbose", "0, 1 or 2", value)


def _check_run_id(value: Any) -> None:
    if value is not None and not (isinstance(value, str) and RUN_ID.match(value)):
        raise _refuse("run_id", "None or a name of letters, digits, '_', '.' and '-'", value)


CHECKS: dict[str, Callable[[Any], None]] = {
    "num_proc": lambda v: _positive_int("num_proc", v, optional=True),
    "model": _check_model,
    "optimizer": _check_optimizer,
    "loss": _check_loss,
    "store": _check_store,
    "feature_cols": lambda v: _column_list("feature_cols", v),
    "label_cols": lambda v: _column_list("label_cols", v),
    "batch_size": lambda v: _positive_int("batch_size", v, optional=False),
    "val_batch_size": lambda v: _positive_int("val_batch_size", v, optional=True),
    "epochs": lambda v: _positive_int("epochs", v, optional=False),
    "validation": check_validation,
    "run_id": _check_run_id,
    "shuffle": _check_bool("shuffle"),
    "random_seed": _check_seed,
    "metrics": lambda v: _callables("metrics", v, nested=True),
    "callbacks": lambda v: _callables("callbacks", v, nested=False),
    "verbose": _check_verbose,
    "train_steps_per_epoch": lambda v: _positive_int("train_steps_per_epoch", v, optional=True),
    "validation_steps_per_epoch": lambda v: _positive_int("validation_steps_per_epoch", v, optional=True),
    "input_shapes": check_input_shapes,
    "backend": _check_backend,
    "backward_passes_per_step": lambda v: _positive_int("backward_passes_per_step", v, optional=False),
}


def check_value(name: str, value: Any) -> None:
    """Refuse a bad `value` for parameter `name` (ConfigError naming it and what it accepts)."""
    CHECKS[name](value)


def check_complete(values: dict[str, Any]) -> None:
    """The checks that need several parameters, made at fit before any Spark job: required ones set, the
    optimizer built on the model, one loss and one input shape per column where lists are given."""
    for name in ("model", "optimizer", "loss", "store", "feature_cols", "label_cols"):
        if values.get(name) is None:
            raise ConfigError(f"TorchEstimator: {name} is required and not set")
    if values.get("backend") is not None and values.get("num_proc") is not None:
        raise ConfigError(
            "TorchEstimator: at most one of backend and num_proc may be set (as Horovod's): the backend "
            "says how many processes"
        )
    model_params = {id(p) for p in values["model"].parameters()}
    opt_params = [p for group in values["optimizer"].param_groups for p in group["params"]]
    if not opt_params or any(id(p) not in model_params for p in opt_params):
        raise ConfigError(
            "TorchEstimator: optimizer must be built on the model's parameters "
            "(e.g. torch.optim.SGD(model.parameters(), lr=0.1)); its parameters are not the model's"
        )
    labels, loss = values["label_cols"], values["loss"]
    if isinstance(loss, (list, tuple)) and len(loss) != len(labels):
        raise _refuse("loss", f"one loss per label column ({len(labels)}: {list(labels)})", loss)
    shapes, features = values.get("input_shapes"), values["feature_cols"]
    if shapes is not None and len(shapes) != len(features):
        raise _refuse(
            "input_shapes", f"one shape per feature column ({len(features)}: {list(features)})", shapes
        )
    overlap = set(features) & set(labels)
    if overlap:
        raise _refuse(
            "label_cols", f"columns that are not also feature_cols (both: {sorted(overlap)})", labels
        )
    validation = values.get("validation")
    if isinstance(validation, str) and validation in set(features) | set(labels):
        raise _refuse("validation", "a column that is neither a feature nor a label column", validation)
