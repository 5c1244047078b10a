"""The `--horovod` switch: a contract between what starts ranks and the ranks' `import horovod`.

`hpcring run --horovod`, `hpcring.run` and the Ray executors (`horovod=True`) set HPCRING_HOROVOD=1 in
every rank, and put the alias's `site/` folder first on PYTHONPATH where a rank's Python may not be started
through hpcring; in the rank, hpcring.horovod_alias answers `import horovod`. Each refuses first when a real
Horovod is importable (`refuse_if_real_horovod`), looking past the alias's own finder. Standard library only,
so the launcher and the executors reach it without importing the alias.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from hpcring.errors import ConfigError

ENV_VARIABLE = "HPCRING_HOROVOD"
# The alias's sitecustomize folder (hpcring/horovod_alias/site), found from this file's place in the package.
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod_alias", "site")
# The attribute that marks the alias's finder in sys.meta_path (real_horovod looks past it).
FINDER_MARK = "hpcring_horovod_alias"
_TRUE = ("1", "true", "yes", "on")


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether HPCRING_HOROVOD asks for the alias (1/true/yes/on)."""
    value = (os.environ if environ is None else environ).get(ENV_VARIABLE, "")
    return value.strip().lower() in _TRUE


def rank_environment(pythonpath: str | None) -> dict[str, str]:
    """What a launcher sets in every rank: the switch, and `site/` first on PYTHONPATH (`pythonpath` is
    the path the ranks would have otherwise) for ranks whose Python is not started through hpcring."""
    entries = [SITE_DIR, *[p for p in (pythonpath or "").split(os.pathsep) if p and p != SITE_DIR]]
    return {ENV_VARIABLE: "1", "PYTHONPATH": os.pathsep.join(entries)}


def real_horovod() -> str | None:
    """Where a real `horovod` package would be imported from, looking past the alias; None when none."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if getattr(finder, FINDER_MARK, False) or find is None:
            continue
        try:
            spec = find("horovod", None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            if spec.origin not in (None, "namespace"):
                return str(spec.origin)
            return ", ".join(spec.submodule_search_locations or ()) or "a namespace package"
    return None


def real_horovod_message(location: str, why: str) -> str:
    return (
        f"{why}, but a real Horovod is installed ({location}); hpcring will not shadow it: "
        "uninstall Horovod from this environment, or run without --horovod / HPCRING_HOROVOD"
    )


def refuse_if_real_horovod(why: str = "--horovod was given") -> None:
    """ConfigError (one line) when a real Horovod could be imported here."""
    found = real_horovod()
    if found is not None:
        raise ConfigError(real_horovod_message(found, why))
