"""`horovod.common.util` for the alias: the helpers Horovod scripts call, answered for hpcring.

Horovod's versions inspect its compiled extensions (`mpi_lib_v2.so` per framework). hpcring has one
"extension", `horovod.torch` (hpcring.torch), available whenever torch is; the others are hpcring's answer
for a framework it does not support: not built (`check_extension` raises, naming what to use instead).
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "EXTENSIONS",
    "HorovodVersionMismatchError",
    "ccl_built",
    "check_extension",
    "check_installed_version",
    "ddl_built",
    "env",
    "extension_available",
    "get_average_backwards_compatibility_fun",
    "get_ext_suffix",
    "get_extension_full_path",
    "get_version_mismatch_message",
    "gloo_built",
    "gpu_available",
    "is_iterable",
    "is_version_greater_equal_than",
    "mpi_built",
    "nccl_built",
    "num_rank_is_power_2",
    "split_list",
]

EXTENSIONS = ["tensorflow", "torch", "mxnet"]


def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _short(ext: str) -> str:
    """'horovod.torch', 'torch' -> 'torch'."""
    return ext.rpartition(".")[2]


def get_ext_suffix() -> str:
    """The file suffix of this Python's extension modules."""
    return str(sysconfig.get_config_var("EXT_SUFFIX") or sysconfig.get_config_var("SO") or ".so")


def get_extension_full_path(pkg_path: str, *args: str) -> str:
    """Where Horovod would look for an extension (kept for scripts that print it)."""
    if not args:
        raise ValueError("get_extension_full_path needs at least one path component")
    directory = os.path.join(os.path.dirname(pkg_path), *args[:-1])
    return os.path.join(directory, args[-1] + get_ext_suffix())


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: str) -> None:
    """ImportError unless `ext_name` is one hpcring answers: horovod.torch, with torch installed."""
    del pkg_path, args
    if _short(ext_name) != "torch":
        raise ImportError(
            f"Extension {ext_name} has not been built: hpcring answers only horovod.torch "
            f"(PyTorch); {ext_env_var} has no effect here"
        )
    if not _torch_available():
        raise ImportError(f"Extension {ext_name} is not available: torch is not installed")


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True for torch when torch is installed; hpcring supports no other framework."""
    available = _short(ext_base_name) == "torch" and _torch_available()
    if verbose:
        print(f"Extension {ext_base_name} {'was' if available else 'was NOT'} built.")
    return available


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the framework sees a GPU (torch only)."""
    del verbose
    if not extension_available(ext_base_name):
        return False
    import torch

    return bool(torch.cuda.is_available())


def _torch_basics() -> Any:
    from hpcring.torch import basics

    return basics


def mpi_built(verbose: bool = False) -> bool:
    """hpcring always runs over MPI (mpi4py)."""
    del verbose
    return importlib.util.find_spec("mpi4py") is not None


def gloo_built(verbose: bool = False) -> bool:
    """hpcring has no Gloo controller."""
    del verbose
    return False


def nccl_built(verbose: bool = False) -> bool:
    """torch's NCCL is usable (hpcring.torch.nccl_built)."""
    del verbose
    return _torch_available() and bool(_torch_basics().nccl_built())


def ddl_built(verbose: bool = False) -> bool:
    del verbose
    return False


def ccl_built(verbose: bool = False) -> bool:
    del verbose
    return False


@contextmanager
def env(**kwargs: str | None) -> Iterator[None]:
    """Set environment variables for the block (None values are left alone), then restore them."""
    values = {k: v for k, v in kwargs.items() if v is not None}
    backup = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in backup.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable[[Any, Any], Any]:
    """Horovod's `op`/`average` reconciliation: `op` wins, `average` is deprecated, both is an error."""

    def impl(op: Any, average: Any) -> Any:
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            warnings.warn(
                "Parameter `average` has been replaced with `op` and will be removed in v1.0",
                DeprecationWarning,
                stacklevel=2,
            )
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average

    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(items: Sequence[Any], n: int) -> list[Sequence[Any]]:
    """`items` in `n` contiguous chunks whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x: object) -> bool:
    try:
        iter(x)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def _version_key(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit()) if not piece.isdigit() else piece
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether release `ver` >= `target` (numeric components; a pre-release counts as its release)."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"This function only accepts string arguments, got {ver!r} and {target!r}")
    return _version_key(ver) >= _version_key(target)


def get_version_mismatch_message(name: str, version: str, installed_version: str | None) -> str:
    return (
        f"Framework {name} installed with version {installed_version} but found version {version}. "
        "This can result in unexpected behavior including runtime errors."
    )


class HorovodVersionMismatchError(ImportError):
    """Horovod's error for a framework upgraded after Horovod was built; hpcring builds nothing, so it
    never raises it, but scripts catch it by name."""

    def __init__(self, name: str, version: str, installed_version: str | None) -> None:
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version


def check_installed_version(name: str, version: str, exception: BaseException | None = None) -> None:
    """Nothing to check: hpcring compiles no framework extension, so no built-against version can differ."""
    del name, version, exception
