"""Spark ML Params with Horovod's names, and their setters and getters (`setEpochs`, `getEpochs`, ...)
made from one table, so that the estimator and the model declare each parameter once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.ml.param import Param, Params


def camel(name: str) -> str:
    """`batch_size` -> `BatchSize` (Horovod's setter and getter names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def add_params(cls: type, docs: dict[str, str], check: Callable[[str, Any], None] | None = None) -> None:
    """Give `cls` a Param for each entry of `docs` and a setX/getX pair for it; `check(name, value)` runs
    on every value set, so that a bad one is refused where it is given."""
    for name, doc in docs.items():
        setattr(cls, name, Param(Params._dummy(), name, doc))

        def setter(self: Any, value: Any, _name: str = name) -> Any:
            if check is not None:
                check(_name, value)
            return self._set(**{_name: value})

        def getter(self: Any, _name: str = name) -> Any:
            return self.getOrDefault(_name)

        setter.__doc__ = f"Set {name}: {doc}."
        getter.__doc__ = f"The value of {name}: {doc}."
        if not hasattr(cls, f"set{camel(name)}"):
            setattr(cls, f"set{camel(name)}", setter)
        if not hasattr(cls, f"get{camel(name)}"):
            setattr(cls, f"get{camel(name)}", getter)
