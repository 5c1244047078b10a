"""The boundary of the request path's core: the compiled extension, or its pure-Python twin.

Everything the engine and `hpcring.torch` do per request and per handle goes through the names exported
here: `Handle`, `Request`, `Pending`, `Lock` (the engine lock), `complete` (completion), `wait_polled` (the
negotiation's wait on MPI), `submitter` (hpcring.torch's one-call submit and synchronize) and `entry` (a
public function entered in C: `allreduce_async_`). `_core` (C, `src/`) is used when it was built and loads;
`fallback` (Python, same behaviour) when it was not, or when HPCRING_PURE_PYTHON=1 asks for it.
`describe()` says which, for `hpcring doctor`. The torch reader (`_torch_reader`, C++, built against the
installed torch) serves `_core`'s submit where it loads (`reader_status()`). docs/dev/engine.md, "The
compiled core" and "The torch reader".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hpcring.config import parse_bool
from hpcring.engine.core import fallback
from hpcring.engine.core.fallback import drain

PURE_PYTHON_VAR = "HPCRING_PURE_PYTHON"
TORCH_READER_VAR = "HPCRING_TORCH_READER"

_impl: Any = fallback
_why = ""
_forced = PURE_PYTHON_VAR in os.environ and parse_bool(PURE_PYTHON_VAR, os.environ[PURE_PYTHON_VAR])
if _forced:
    _why = f"{PURE_PYTHON_VAR}=1"
else:
    try:
        from hpcring.engine.core import _core as _impl
    except ImportError as exc:  # not built (no compiler at install), or built for another Python
        _why = f"the compiled core is not available: {exc}"

if TYPE_CHECKING:
    from hpcring.engine.core.fallback import Handle, Lock, Pending, Request, complete
else:
    Handle = _impl.Handle
    Request = _impl.Request
    Pending = _impl.Pending
    Lock = _impl.Lock
    complete = _impl.complete

__all__ = [
    "Handle",
    "Lock",
    "Pending",
    "Request",
    "complete",
    "describe",
    "drain",
    "forced",
    "kind",
    "lone_cycle",
    "reader_status",
    "reader_turned_off",
    "submitter",
    "wait_polled",
]


def kind() -> str:
    """ "compiled" or "python": which request path this process runs."""
    return "python" if _impl is fallback else "compiled"


def forced() -> bool:
    """True when HPCRING_PURE_PYTHON asked for the pure-Python path."""
    return _forced


def describe() -> str:
    """One line for `hpcring doctor`: which core, and why the fallback where it is in use."""
    if _impl is fallback:
        return f"pure Python ({_why})"
    return f"compiled ({os.path.basename(str(_impl.__file__))})"


def reader_status() -> tuple[bool, str]:
    """For `hpcring doctor`: whether the compiled submit reads tensors through the torch reader, and a line
    saying how it reads them (and why not the reader, with how to build it)."""
    if _impl is fallback:
        return False, "torch's Python API (the pure-Python path)"
    reader, why = _load_reader()
    if reader is not None:
        return True, f"torch's C++ API (the torch reader, built against torch {reader.TORCH_VERSION})"
    return False, f"torch's Python attributes ({why})"


def reader_turned_off() -> bool:
    """True when HPCRING_TORCH_READER=0 turned the torch reader off."""
    value = os.environ.get(TORCH_READER_VAR)
    return value is not None and not parse_bool(TORCH_READER_VAR, value)


def _load_reader() -> tuple[Any, str]:
    """The torch reader's module, or None and why not. It loads only under the torch it was built against
    (it checks before touching torch); HPCRING_TORCH_READER=0 turns it off (the paired benchmarks)."""
    if reader_turned_off():
        return None, f"{TORCH_READER_VAR}=0"
    try:
        from hpcring.engine.core import _torch_reader as reader
    except ImportError as exc:
        why = str(exc)
        if "No module named" in why:  # not built: the install had no torch to build against
            why = "not built: pip install --no-build-isolation hpcring, with torch installed first"
        return None, why
    return reader, ""


def submitter(*, dtypes: dict[Any, tuple[str, int, int]], use_reader: bool = True, **config: Any) -> Any:
    """hpcring.torch's one-call submit and synchronize (`_core.Submitter`), or None on the Python path.
    `dtypes` maps each torch dtype the core takes to its (name, numpy type number, item size); the torch
    reader, where it loads (and `use_reader`), reads a tensor's dtype as c10's number, mapped through the
    same table."""
    if _impl is fallback:
        return None
    reader = _load_reader()[0] if use_reader else None
    scalar_types: tuple[Any, ...] = ()
    if reader is not None:
        numbers = {reader.scalar_type_of(dtype): entry for dtype, entry in dtypes.items()}
        scalar_types = tuple(numbers.get(i) for i in range(max(numbers, default=-1) + 1))
    return _impl.Submitter(
        dtypes=dtypes,
        reader=reader.READ_TENSOR if reader is not None else None,
        scalar_types=scalar_types,
        **config,
    )


def entry(submitter: Any, python_fn: Any, default_set: Any) -> Any:
    """A public function entered in C over its Python twin (`_core.Entry`; hpcring.torch.one_call): only
    where `submitter()` gave a Submitter, so only on the compiled path."""
    return _impl.Entry(submitter, python_fn, default_set)


_mpi_addressof: Any = None  # mpi4py's MPI._addressof once MPI_Test is bound; False where it cannot be


def _libmpi_path() -> str | None:
    """The libmpi this process has loaded (mpi4py's), read from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if "/libmpi" in "/" + path and ".so" in path:
                    return "/" + path
    except OSError:
        return None
    return None


def _bind_mpi() -> Any:
    """MPI._addressof once the core found MPI_Test in the loaded libmpi (looked up once), else False."""
    global _mpi_addressof
    if _mpi_addressof is None:
        from mpi4py import MPI

        path = _libmpi_path()
        _mpi_addressof = MPI._addressof if path is not None and _impl.bind_mpi(path) else False
    return _mpi_addressof


def wait_polled(req: Any) -> None:
    """Wait for an mpi4py request: spin, then back off (collective/progress.py says why); in the compiled core
    the whole wait runs without the GIL, so the training thread keeps running while the engine waits."""
    if _impl is not fallback:
        addressof = _bind_mpi()
        if addressof:
            _impl.wait_mpi(addressof(req))
            return
    from hpcring.collective.kernels import wait_polled as python_wait

    python_wait(req)


def lone_cycle(**config: Any) -> Any:
    """The compiled lone request's cycle (`_core.LoneCycle`, engine/lone_cycle.py), or None on the Python
    path or where the loaded MPI's entry points it calls were not found."""
    if _impl is fallback or not _bind_mpi() or not _impl.mpi_bound():
        return None
    return _impl.LoneCycle(**config)
