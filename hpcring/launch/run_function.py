"""The caller's side of `hpcring.run(fn, ...)`: the call goes to the ranks in a file, results come back so.

One private folder (mode 0700) per call holds `payload` (the caller's sys.path, then the pickled
`(fn, args, kwargs)`); each rank (`hpcring.launch.run_rank`) leaves its pickled return value in
`result.<rank>-of-<size>`, or the exception's type, message and traceback text in `error.<rank>.json`. The
folder is removed when the call ends, whatever happened. Nothing travels on a command line but the folder's
path. Ranks on other hosts must see the folder: it is then made in the caller's working directory, which
clusters share, instead of the node-local temporary folder."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcring._deps import require
from hpcring.errors import ConfigError, RankFailedError

PAYLOAD = "payload"
RANK_ENTRY = "hpcring.launch.run_rank"


def result_name(rank: int, size: int) -> str:
    """Named with the world size too: an elastic job's earlier, larger world may have left more ranks'."""
    return f"result.{rank}-of-{size}"


def error_name(rank: int) -> str:
    return f"error.{rank}.json"


class RunFunctionError(RankFailedError):
    """A rank of `hpcring.run` raised, or ended without a result: names the rank and its host.

    `traceback` is the rank's own traceback text ("" when it died without raising); `others` lists the
    other ranks that raised too.
    """

    def __init__(
        self, rank: int, host: str, how: str, traceback: str = "", others: Sequence[int] = ()
    ) -> None:
        super().__init__(rank, how)
        self.host = host
        self.traceback = traceback
        self.others = tuple(others)
        where = f"rank {rank}" + (f" (host {host})" if host else "")
        text = f"hpcring.run: {where} {how}"
        if self.others:
            text += f" (ranks {', '.join(map(str, self.others))} raised too)"
        if traceback:
            text += f"\n\n{where}'s traceback:\n{traceback.rstrip()}"
        self.args = (text,)


@dataclass(frozen=True)
class FunctionDir:
    """The call's private folder."""

    path: Path

    def rank_command(self, python: str) -> tuple[str, ...]:
        return (python, "-m", RANK_ENTRY, str(self.path))


@contextlib.contextmanager
def function_dir(
    fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any], shared: bool
) -> Iterator[FunctionDir]:
    """A 0700 folder holding the pickled call; removed on the way out. `shared`: ranks run on other hosts."""
    cloudpickle = require("cloudpickle")
    try:
        blob = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise ConfigError(
            f"hpcring.run: the function or its arguments cannot be pickled for the ranks: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    parent = os.getcwd() if shared else None
    path = Path(tempfile.mkdtemp(prefix=".hpcring-run-" if shared else "hpcring-run-", dir=parent))
    try:
        os.chmod(path, 0o700)
        with open(path / PAYLOAD, "wb") as f:
            pickle.dump([p for p in sys.path if p], f)
            f.write(blob)
        yield FunctionDir(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _error(folder: Path, rank: int) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / error_name(rank)).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def final_size(folder: FunctionDir) -> int | None:
    """The world size of rank 0's latest result (an elastic job's last world), None when it left none."""
    found = sorted(folder.path.glob("result.0-of-*"), key=lambda p: p.stat().st_mtime)
    return int(found[-1].name.rpartition("-")[2]) if found else None


def collect(
    folder: FunctionDir,
    np: int,
    status: int,
    failure: tuple[int, str, int] | None,
    hosts: Mapping[int, str],
) -> list[Any]:
    """Each rank's return value in rank order, or RunFunctionError for the rank that failed first."""
    errors = {r: e for r in range(np) if (e := _error(folder.path, r)) is not None}
    first = failure[0] if failure is not None and failure[0] >= 0 else None
    if first is None and errors:
        first = min(errors)
    if first is not None:
        err = errors.get(first)
        host = str(err.get("host", "")) if err else hosts.get(first, "")
        if err is not None:
            how = f"raised {err.get('type', 'an exception')}: {err.get('message', '')}"
            others = sorted(r for r in errors if r != first)
            raise RunFunctionError(first, host, how, str(err.get("traceback", "")), others)
        how = failure[1] if failure is not None else "failed"
        raise RunFunctionError(
            first, host, f"{how} before returning a result (its output above says more)", "", sorted(errors)
        )
    if status != 0:
        detail = failure[1] if failure is not None else f"the launcher exited with status {status}"
        raise RunFunctionError(-1, "", f"no result: {detail} (the launcher's output above says more)")
    values: list[Any] = []
    for rank in range(np):
        try:
            data = (folder.path / result_name(rank, np)).read_bytes()
        except OSError:
            raise RunFunctionError(
                rank, hosts.get(rank, ""), "exited with status 0 but left no result (did it call os._exit?)"
            ) from None
        values.append(pickle.loads(data))
    return values
