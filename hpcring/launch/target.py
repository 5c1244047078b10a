"""What a rank's command runs, read from its command line, and whether it exists before anything starts.

Shared by the rank wrapper (which puts hpcring's runner in front of `python X ...`) and by `hpcring run`,
which refuses a missing script, module or program with one line before it starts mpiexec: otherwise every
rank fails on its own after the job's start-up, and the error arrives once per rank.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hpcring.errors import ConfigError

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
_PY_OPTS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
_PATH_OPTIONS = ("-I", "-E", "-P")  # options that change where `-m` looks: its check is skipped


@dataclass(frozen=True)
class PythonTarget:
    """`python [options] X ...`: where X stands in the command, what kind it is and its value."""

    index: int
    kind: Literal["script", "module", "code", "stdin"]
    value: str
    options: tuple[str, ...] = ()  # the interpreter options before X


def is_python(program: str) -> bool:
    """True when `program` (a name or path) is named like an interpreter: python, python3, python3.11."""
    return bool(_PYTHON_NAME.match(os.path.basename(program)))


def own_python(exe: str) -> bool:
    """True for an interpreter of this very environment (our bin directory: it can import hpcring)."""
    return os.path.dirname(os.path.abspath(exe)) == os.path.dirname(os.path.abspath(sys.executable))


def python_target(cmd: Sequence[str]) -> PythonTarget | None:
    """For a command run by a Python interpreter, what it runs; None for other programs and for the rare
    spellings `-mMODULE`/`-cCODE` (they are left as they are)."""
    if not cmd or not is_python(cmd[0]):
        return None
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-", "-m", "-c"):
        if cmd[i].startswith(("-m", "-c")):
            return None
        i += 2 if cmd[i] in _PY_OPTS_WITH_VALUE else 1
    options = tuple(cmd[1:i])
    if i >= len(cmd) or cmd[i] == "-":
        return PythonTarget(i, "stdin", "-", options)
    if cmd[i] in ("-m", "-c"):
        if i + 1 >= len(cmd):
            return None  # python reports it: "Argument expected for the -m option"
        return PythonTarget(i, "module" if cmd[i] == "-m" else "code", cmd[i + 1], options)
    return PythonTarget(i, "script", cmd[i], options)


def check_command(cmd: Sequence[str], cwd: str | None = None) -> None:
    """ConfigError naming what is missing when the command cannot start: its program, a Python script, or a
    `-m` module (checked for an interpreter of this environment only, with `python -m`'s search path)."""
    here = cwd or os.getcwd()
    program = _program(cmd[0], here)
    target = python_target(cmd)
    if target is None:
        return
    if target.kind == "script":
        path = Path(here, target.value)
        if not path.exists():
            raise ConfigError(
                f"python script {target.value!r} does not exist (looked in {here}); nothing was launched"
            )
    elif target.kind == "module" and own_python(program) and not set(target.options) & set(_PATH_OPTIONS):
        missing = _missing_module(target.value, here)
        if missing:
            raise ConfigError(
                f"python -m {target.value}: {missing} (searched from {here} and this environment's "
                "sys.path); nothing was launched"
            )


def _program(name: str, cwd: str) -> str:
    """The program's path: a path must be an executable file, a bare name must be on PATH."""
    if "/" in name:
        path = os.path.join(cwd, name)
        if not os.path.isfile(path):
            raise ConfigError(f"program {name!r} does not exist (looked in {cwd}); nothing was launched")
        if not os.access(path, os.X_OK):
            raise ConfigError(f"program {name!r} is not executable (chmod +x it); nothing was launched")
        return os.path.abspath(path)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"program {name!r} is not on PATH; nothing was launched")
    return found


def _missing_module(name: str, cwd: str) -> str | None:
    """Why `python -m name` would not find its module, or None; nothing is imported (a package's submodule
    is looked up in the package's directories, not by importing the package)."""
    parts = name.split(".")
    saved = list(sys.path)
    sys.path.insert(0, cwd)
    try:
        loaded = sys.modules.get(name)
        if loaded is not None:  # imported here already (os.path, say): it exists
            spec = getattr(loaded, "__spec__", None)
            if spec is None or spec.submodule_search_locations is None:
                return None
            parts, rest = [name], ["__main__"]  # a package: only its __main__ is left to find
        else:
            spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
            if spec is None:
                return f"no module named {parts[0]!r}"
            rest = [*parts[1:], "__main__"]
        for depth, part in enumerate(rest, start=1):
            locations = spec.submodule_search_locations
            if locations is None:
                # A module, not a package: only its import could add submodules (six.moves): let Python say.
                return None
            child = importlib.machinery.PathFinder.find_spec(part, list(locations))
            if child is None:
                # A package that extends its own __path__ when imported can hold more than its directory.
                if _extends_path(spec):
                    return None
                if depth == len(parts):
                    return f"{name!r} is a package without a __main__ module, so it cannot be run"
                return f"no module named {'.'.join(parts[: depth + 1])!r}"
            spec = child  # a module ends the walk at the next round; a package needs its __main__
        return None
    except (ImportError, ValueError):
        return None  # a finder that cannot answer without importing: let Python decide at run time
    finally:
        sys.path[:] = saved


def _extends_path(spec: importlib.machinery.ModuleSpec) -> bool:
    if not spec.origin or not os.path.isfile(spec.origin):
        return True  # not a plain package directory: its finder may know more
    try:
        return "__path__" in Path(spec.origin).read_text(errors="replace")
    except OSError:
        return True
