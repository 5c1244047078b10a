"""Horovod's Store (horovod/spark/common/store.py): where an estimator keeps its prepared data and runs.

A store has two views of each path: the full path Spark writes to (`file:///...`, `dbfs:/...`) and the
localized path a rank opens with plain file I/O (`/...`, `/dbfs/...`). Only file systems that every
executor mounts are served: a local or shared (NFS, Lustre, GPFS) directory, and Databricks' DBFS through
its `/dbfs/` FUSE mount. HDFS, S3 and the like need a file-system client on every rank and are refused by
name rather than half-served.
"""

from __future__ import annotations

import os
import re
from typing import ClassVar

from hpcring.errors import ConfigError
from hpcring.files import write_whole

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class Store:
    """Paths of an estimator's intermediate data and runs under one prefix (`Store.create(prefix_path)`)."""

    @staticmethod
    def create(prefix_path: str, **kwargs: object) -> Store:
        """`DBFSLocalStore` for `dbfs:/...` and `/dbfs/...`, `LocalStore` for plain and `file:` paths."""
        if not isinstance(prefix_path, str) or not prefix_path:
            raise ConfigError(
                f"Store.create(prefix_path): a non-empty path string is needed, got {prefix_path!r}"
            )
        if DBFSLocalStore.matches_dbfs(prefix_path):
            return DBFSLocalStore(prefix_path, **kwargs)  # type: ignore[arg-type]
        scheme = _SCHEME.match(prefix_path)
        if scheme and scheme.group(1).lower() != "file":
            raise ConfigError(
                f"Store.create({prefix_path!r}): the {scheme.group(1)!r} scheme is not supported; hpcring's "
                "stores are file systems every executor mounts: a plain or file:// path (local or shared) "
                "or dbfs:/ (Databricks' /dbfs/ mount)"
            )
        return LocalStore(prefix_path, **kwargs)  # type: ignore[arg-type]


class FilesystemStore(Store):
    """A store on a mounted file system: `prefix_path` is a plain path or `file://` URL."""

    _URL_PREFIX: ClassVar[str] = "file://"

    def __init__(
        self,
        prefix_path: str,
        train_path: str | None = None,
        val_path: str | None = None,
        runs_path: str | None = None,
        save_runs: bool = True,
        checkpoint_filename: str | None = None,
    ) -> None:
        self.prefix_path = self.get_full_path(prefix_path)
        self._train_path = self._full_or_default(train_path, "intermediate_train_data")
        self._val_path = self._full_or_default(val_path, "intermediate_val_data")
        self._runs_path = self._full_or_default(runs_path, "runs")
        self._save_runs = bool(save_runs)
        self.checkpoint_filename = checkpoint_filename or "checkpoint.pt"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.prefix_path!r})"

    def _full_or_default(self, path: str | None, default_key: str) -> str:
        if path is not None:
            return self.get_full_path(path)
        return self.prefix_path.rstrip("/") + "/" + default_key

    # The two views of a path.
    def get_full_path(self, path: str) -> str:
        """The URL Spark reads and writes: `file:///abs/path`."""
        return self._URL_PREFIX + os.path.abspath(self.get_localized_path(path))

    def get_localized_path(self, path: str) -> str:
        """The path for plain file I/O on a rank: the URL without its `file:` scheme."""
        if path.startswith("file://"):
            return path[len("file://") :]
        if path.startswith("file:"):
            return path[len("file:") :]
        return path

    # Horovod's path getters (full paths, as Horovod's are).
    def get_train_data_path(self, idx: int | None = None) -> str:
        return self._train_path if idx is None else f"{self._train_path}.{idx}"

    def get_val_data_path(self, idx: int | None = None) -> str:
        return self._val_path if idx is None else f"{self._val_path}.{idx}"

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return self._runs_path.rstrip("/") + "/" + run_id

    def get_checkpoint_path(self, run_id: str) -> str | None:
        """The folder of `run_id`'s checkpoints (its run path), None when the store keeps no runs."""
        return self.get_run_path(run_id) if self._save_runs else None

    def get_checkpoint_filename(self) -> str:
        return self.checkpoint_filename

    def get_logs_subdir(self) -> str:
        return "logs"

    def get_logs_path(self, run_id: str) -> str | None:
        return self.get_run_path(run_id) + "/" + self.get_logs_subdir() if self._save_runs else None

    def get_checkpoints(self, run_id: str, suffix: str = ".pt") -> list[str]:
        """The checkpoint files of `run_id` (full paths, sorted)."""
        folder = self.get_checkpoint_path(run_id)
        if folder is None or not self.exists(folder):
            return []
        names = sorted(n for n in os.listdir(self.get_localized_path(folder)) if n.endswith(suffix))
        return [folder + "/" + n for n in names]

    # File access on the localized view.
    def exists(self, path: str) -> bool:
        return os.path.exists(self.get_localized_path(path))

    def read(self, path: str) -> bytes:
        with open(self.get_localized_path(path), "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        """Write `data` to `path` whole: a reader sees the old file or the new one (rename), never half."""
        write_whole(self.get_localized_path(path), data)

    def write_text(self, path: str, text: str) -> None:
        self.write(path, text.encode())


class LocalStore(FilesystemStore):
    """A directory on a file system every executor mounts at the same path (local for one host, or shared)."""


class DBFSLocalStore(FilesystemStore):
    """Databricks File System through its FUSE mount: Spark uses `dbfs:/x`, the ranks open `/dbfs/x`."""

    _URL_PREFIX: ClassVar[str] = "dbfs:"

    @classmethod
    def matches_dbfs(cls, path: str) -> bool:
        return (
            (path.startswith("dbfs:/") and not path.startswith("dbfs://"))
            or path.startswith("/dbfs/")
            or path.startswith("file:///dbfs/")
            or path.startswith("file:/dbfs/")
        )

    @staticmethod
    def normalize_path(path: str) -> str:
        """`path` in the `/dbfs/...` form."""
        for prefix, keep in (("dbfs:/", "/dbfs/"), ("file:///dbfs/", "/dbfs/"), ("file:/dbfs/", "/dbfs/")):
            if path.startswith(prefix) and not path.startswith("dbfs://"):
                return keep + path[len(prefix) :]
        if path.startswith("/dbfs/"):
            return path
        raise ConfigError(
            f"not a DBFS path: {path!r} (use dbfs:/..., /dbfs/..., file:/dbfs/... or file:///dbfs/...)"
        )

    def get_full_path(self, path: str) -> str:
        """`dbfs:/x` for `/dbfs/x` and the other spellings."""
        return "dbfs:" + self.normalize_path(path)[len("/dbfs") :]

    def get_localized_path(self, path: str) -> str:
        return self.normalize_path(path)
