"""What the elastic driver and the workers agree on: environment variable names, the reset exit code and the
host-update notice. Kept torch- and MPI-free so both sides (and the Ray executor) import it cheaply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcring.files import write_whole

# A worker exits with this code after it has saved its state because the world must change size (hosts were
# added or removed, or a collective failed under it). The driver relaunches instead of failing the job.
RESET_EXIT_CODE = 75  # EX_TEMPFAIL: "try again"

ELASTIC = (
    "HPCRING_ELASTIC"  # "1" in every rank of an elastic job (HOROVOD_ELASTIC too, as horovodrun sets it)
)
DIRECTORY = "HPCRING_ELASTIC_DIR"  # node-local directory of the commit store (same path on every host)
GENERATION = "HPCRING_ELASTIC_GENERATION"  # 0 for the first world, +1 at every relaunch
NOTIFY = "HPCRING_ELASTIC_NOTIFY"  # node-local file the rank wrapper writes when the driver announces hosts
HOST = "HPCRING_ELASTIC_HOST"  # the host name the driver assigned this rank to (blacklisting unit)
# "1" in a worker's own environment once it has committed: its runner's failure report says so, and the
# launcher then ends the world at once instead of waiting to see whether every rank fails alike.
COMMITTED = "HPCRING_ELASTIC_COMMITTED"

ADDED, REMOVED, MIXED = "added", "removed", "mixed"


@dataclass(frozen=True)
class Notice:
    """A host-update announcement: a timestamp that only grows, and what changed."""

    timestamp: int
    result: str  # ADDED | REMOVED | MIXED

    def to_json(self) -> dict[str, object]:
        return {"timestamp": self.timestamp, "result": self.result}


def write_notice(path: str | Path, notice: Mapping[str, object]) -> None:
    """Write the notice file atomically (a reader sees the old notice or the new one, never half of one)."""
    write_whole(path, json.dumps(dict(notice)).encode())


def read_notice(path: str | Path | None) -> Notice | None:
    """The last notice written to `path`, or None when there is none (or it cannot be read yet)."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        return Notice(int(data["timestamp"]), str(data["result"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def generation(env: Mapping[str, str] | None = None) -> int:
    """This world's generation (0 when not under the elastic driver)."""
    e = os.environ if env is None else env
    try:
        return int(e.get(GENERATION, "0") or 0)
    except ValueError:
        return 0
