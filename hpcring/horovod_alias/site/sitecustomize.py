"""Installs hpcring's `horovod` alias at interpreter start-up, then runs the `sitecustomize` this one shadows.

`hpcring run --horovod` puts this folder first on the ranks' PYTHONPATH, so a rank whose Python is not
started through hpcring (a shell wrapper that calls python) gets the alias too (hpcring/horovod_alias).
Inert unless HPCRING_HOROVOD is set; an interpreter that cannot import hpcring is left as it was.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    if os.environ.get("HPCRING_HOROVOD", "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    try:
        from hpcring.horovod_alias.hook import install
    except ImportError:
        return
    install()


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path (a site's or a distribution's), as if this one were absent."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install()
_chain()
