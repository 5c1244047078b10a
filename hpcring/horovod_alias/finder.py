"""The finder at the front of `sys.meta_path` that answers `horovod` and `horovod.*`, and its installation.

It is given the function that makes the specs (`modules.spec_for`, or the hook's lazy stand-in for it), so
that both the hook (at start-up, without loading the module table) and an unpickled alias module (which
must install the alias in the receiving process) can install it, and neither imports the other.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from hpcring.contracts.horovod_alias import FINDER_MARK, real_horovod, real_horovod_message

SpecFor = Callable[[str], importlib.machinery.ModuleSpec]


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers `horovod` and its submodules with hpcring's (the table is in `table.py`)."""

    hpcring_horovod_alias = True  # FINDER_MARK: real_horovod() looks past this finder

    def __init__(self, spec_for: SpecFor) -> None:
        self._spec_for = spec_for

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "horovod" and not fullname.startswith("horovod."):
            return None
        if fullname == "horovod":
            found = real_horovod()
            if found is not None:
                raise ImportError(real_horovod_message(found, "HPCRING_HOROVOD is set"), name=fullname)
        return self._spec_for(fullname)


assert getattr(AliasFinder, FINDER_MARK)


def installed() -> bool:
    """Whether the finder is installed in this process."""
    return any(getattr(f, FINDER_MARK, False) for f in sys.meta_path)


def install(spec_for: SpecFor) -> None:
    """Put the finder first in `sys.meta_path` (idempotent)."""
    if not installed():
        sys.meta_path.insert(0, AliasFinder(spec_for))
