"""The import hook: installs the finder (`finder.py`) that answers `horovod` and `horovod.*`.

Cheap to import: `import hpcring` loads this module when HPCRING_HOROVOD is set (the package docstring says
why), and the modules it answers with are built only when a script imports them.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Mapping

from hpcring.contracts.horovod_alias import FINDER_MARK, requested
from hpcring.horovod_alias import finder


def _spec_for(fullname: str) -> importlib.machinery.ModuleSpec:
    """`modules.spec_for`, the module table loaded only when a `horovod` module is first imported."""
    from hpcring.horovod_alias import modules

    return modules.spec_for(fullname)


def installed() -> bool:
    """Whether the finder is installed in this process."""
    return finder.installed()


def install() -> None:
    """Put the finder first in `sys.meta_path` (idempotent)."""
    finder.install(_spec_for)


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
