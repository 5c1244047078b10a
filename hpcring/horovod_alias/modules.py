"""The `horovod` modules the alias answers with, each forwarding to hpcring's (the table is `table.py`).

An alias module is a thin `ModuleType` that looks names up, on first use, in its hpcring modules
(`targets`, first wins) after its own `names`; a Horovod submodule is reached as an attribute too, as
Horovod scripts do (`hvd.elastic`). Forwarding instead of handing out hpcring's modules themselves keeps a
missing name's error Horovod's (`HorovodFeatureMissing`), while the objects (functions, classes, the
engine state behind them) are hpcring's own: `horovod.torch.allreduce is hpcring.torch.allreduce`.

A name hpcring lacks gives one message in every form: `module.name` raises `HorovodFeatureMissing`;
`from module import name` makes Python look for a submodule `module.name` once the attribute is missing, and
the finder answers that with `HorovodNameUnavailable` (an ImportError carrying the same message: Python
would swallow a ModuleNotFoundError for that name and say "cannot import name" instead). An alias module
pickles as a call that imports it again in the receiving process (Spark tasks, Ray workers, `hpcring.run`'s
ranks), installing the alias there first, so a function using a module-level `hvd` can be sent.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
from types import ModuleType
from typing import Any

from hpcring.horovod_alias import finder
from hpcring.horovod_alias.missing import (
    DOCS,
    HorovodFeatureMissing,
    HorovodFrameworkUnavailable,
    HorovodNameUnavailable,
    feature_missing,
)
from hpcring.horovod_alias.table import TABLE, UNAVAILABLE, Alias


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
        raise _missing(self.__name__, name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_public(self._alias)})

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return import_alias, (self.__name__,)


def import_alias(name: str) -> ModuleType:
    """The alias module `name` in this process, the alias installed first: how an alias module unpickles
    (Spark tasks, Ray workers and `hpcring.run`'s ranks receive functions that use a module-level `hvd`)."""
    finder.install(spec_for)
    return importlib.import_module(name)


def _missing(module: str, name: str) -> HorovodFeatureMissing:
    """The error for Horovod's `module.name` that hpcring lacks, with the alternative when one is known."""
    alias = TABLE[module]
    instead = alias.missing.get(name)
    if instead is None:
        close = difflib.get_close_matches(name, _public(alias), n=3)
        if close:
            instead = f"the closest names it has are {', '.join(close)} ({DOCS})"
    return feature_missing(module, name, instead)


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
    if fullname in TABLE:
        return importlib.machinery.ModuleSpec(
            fullname, _LOADER, origin=f"hpcring alias of {fullname}", is_package=True
        )
    parent, _, name = fullname.rpartition(".")
    unknown = (
        f"Horovod's module {fullname} is not provided by hpcring's horovod alias; the modules it "
        f"answers are {', '.join(sorted(TABLE))} (see {DOCS})"
    )
    if parent not in TABLE:
        raise ModuleNotFoundError(unknown, name=fullname)
    # A child of an alias module: `from parent import name` lands here once the attribute is missing.
    known = name in TABLE[parent].missing or difflib.get_close_matches(name, _public(TABLE[parent]), n=1)
    raise HorovodNameUnavailable(str(_missing(parent, name)) if known else unknown, name=fullname)
