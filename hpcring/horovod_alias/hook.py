"""The import hook: a finder at the front of `sys.meta_path` that answers `horovod` and `horovod.*`.

Cheap to import: `import hpcring` loads this module when HPCRING_HOROVOD is set (the package docstring says
why), and the modules it answers with are built only when a script imports them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

from hpcring.contracts.horovod_alias import FINDER_MARK, real_horovod, real_horovod_message, requested


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers `horovod` and its submodules with hpcring's (the table is in `modules.py`)."""

    hpcring_horovod_alias = True  # FINDER_MARK: real_horovod() looks past this finder

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "horovod" and not fullname.startswith("horovod."):
            return None
        if fullname == "horovod":
            found = real_horovod()
            if found is not None:
                raise ImportError(real_horovod_message(found, "HPCRING_HOROVOD is set"), name=fullname)
        from hpcring.horovod_alias import modules

        return modules.spec_for(fullname)


assert getattr(AliasFinder, FINDER_MARK)


def _finders() -> list[object]:
    return [f for f in sys.meta_path if getattr(f, FINDER_MARK, False)]


def installed() -> bool:
    """Whether the finder is installed in this process."""
    return bool(_finders())


def install() -> None:
    """Put the finder first in `sys.meta_path` (idempotent)."""
    if not installed():
        sys.meta_path.insert(0, AliasFinder())


def uninstall() -> None:
    """Remove the finder and forget the `horovod` modules it answered with."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, FINDER_MARK, False)]
    from hpcring.horovod_alias.modules import AliasModule

    for name in [n for n, m in sys.modules.items() if isinstance(m, AliasModule)]:
        del sys.modules[name]


def install_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Install the finder when HPCRING_HOROVOD asks for it; returns whether it did."""
    if requested(environ):
        install()
        return True
    return False
