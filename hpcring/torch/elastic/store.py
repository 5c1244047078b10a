"""Commits in node-local memory: one file per rank in a tmpfs directory (`/dev/shm`), written atomically.

Why files and not an in-memory copy (Horovod's): hpcring re-forms a world by restarting its processes (MPI
cannot shrink a running world), so a commit must outlive the process that made it. A file on tmpfs is memory
all the same: writing one is a single copy of each tensor's bytes into the page cache, about what
`tensor.clone()` costs, and it survives the process. The next world restores the newest commit of any node.

Format: 8-byte magic, 8-byte header length, a pickled header (sequence number, the state's structure with each
tensor replaced by a reference, and each tensor's dtype/shape/offset), then the raw tensor bytes, each aligned
to 64 bytes. Readers get tensors that view one buffer; nothing is unpickled from tensor data.

The API (also used by `hpcring.ray`): `encode(seq, obj) -> bytes-like parts`, `decode(buffer) -> (seq, obj)`,
`CommitStore(directory, rank).write(seq, obj)`, `.newest() -> (seq, path) | None`, `read(path)`,
`.remove_own()`.
`obj` is any nesting of dicts, lists and tuples whose leaves are tensors or picklable values.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcring import _deps

MAGIC = b"HPCRCMT1"
_LEN = struct.Struct("<Q")
_ALIGN = 64
SUFFIX = ".commit"


@dataclass(frozen=True)
class _Ref:
    """Stands in for the tensor at this index in the header's tensor table."""

    index: int


def _strip(value: Any, tensors: list[Any]) -> Any:
    torch = _deps.torch()
    if torch.is_tensor(value):
        tensors.append(value)
        return _Ref(len(tensors) - 1)
    if isinstance(value, dict):
        return type(value)((k, _strip(v, tensors)) for k, v in value.items())
    if isinstance(value, list):
        return [_strip(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_strip(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: list[Any]) -> Any:
    if isinstance(value, _Ref):
        return tensors[value.index]
    if isinstance(value, dict):
        return type(value)((k, _fill(v, tensors)) for k, v in value.items())
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_fill(v, tensors) for v in value)
    return value


def _pad(n: int) -> int:
    return -n % _ALIGN


def _raw(tensor: Any) -> memoryview:
    """The tensor's bytes, on the host, without another copy when it is already a contiguous CPU tensor."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    torch = _deps.torch()
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def encode(seq: int, obj: Any) -> Iterator[bytes | memoryview]:
    """The commit's bytes as parts to write in order (tensor parts are views of the live tensors)."""
    tensors: list[Any] = []
    skeleton = _strip(obj, tensors)
    table, offset, views = [], 0, []
    for t in tensors:
        view = _raw(t)
        table.append((str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, view.nbytes))
        views.append(view)
        offset += view.nbytes + _pad(view.nbytes)
    header = pickle.dumps({"seq": seq, "skeleton": skeleton, "tensors": table}, protocol=5)
    start = len(MAGIC) + _LEN.size + len(header)
    yield MAGIC + _LEN.pack(len(header)) + header + bytes(_pad(start))
    for view in views:
        yield view
        if _pad(view.nbytes):
            yield bytes(_pad(view.nbytes))


def encode_bytes(seq: int, obj: Any) -> bytearray:
    """The whole commit in one buffer (for a broadcast)."""
    out = bytearray()
    for part in encode(seq, obj):
        out += part
    return out


def decode(buffer: bytes | bytearray | memoryview) -> tuple[int, Any]:
    """(seq, obj) from a commit's bytes; the tensors view `buffer` (copy them before reusing it)."""
    torch = _deps.torch()
    mv = memoryview(buffer)
    if bytes(mv[: len(MAGIC)]) != MAGIC:
        raise ValueError("not an hpcring commit (bad magic)")
    (hlen,) = _LEN.unpack_from(mv, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    header = pickle.loads(mv[start : start + hlen])
    base = start + hlen + _pad(start + hlen)
    tensors = []
    for dtype, shape, offset, nbytes in header["tensors"]:
        dt = getattr(torch, dtype)
        if nbytes:
            flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=base + offset)
            tensors.append(flat.view(dt).reshape(shape))
        else:
            tensors.append(torch.empty(shape, dtype=dt))
    return int(header["seq"]), _fill(header["skeleton"], tensors)


def read(path: str | Path) -> tuple[int, Any]:
    """Load one commit file."""
    return decode(read_bytes(path))


def read_bytes(path: str | Path) -> bytearray:
    """A commit file's bytes, in a writable buffer (torch.frombuffer wants one)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise ValueError(f"commit {path} ended after {got} of {size} bytes")
            got += n
    return buf


def peek_seq(path: str | Path) -> int | None:
    """A commit file's sequence number without reading its tensors; None when it is not a commit."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + _LEN.size)
            if head[: len(MAGIC)] != MAGIC:
                return None
            (hlen,) = _LEN.unpack_from(head, len(MAGIC))
            return int(pickle.loads(f.read(hlen))["seq"])
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, KeyError, struct.error):
        return None


class CommitStore:
    """The commit files of one node's ranks in `directory`; this rank writes `rank-<r>.commit`."""

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.path = self.directory / f"rank-{rank}{SUFFIX}"

    def write(self, seq: int, obj: Any) -> Path:
        """Write the commit atomically: a rank killed mid-write leaves the previous commit intact."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".rank-{self.rank}.{os.getpid()}.tmp"
        with open(tmp, "wb", buffering=0) as f:
            for part in encode(seq, obj):
                f.write(part)
        os.replace(tmp, self.path)
        return self.path

    def newest(self) -> tuple[int, Path] | None:
        """The newest commit on this node, whichever rank of whichever world wrote it."""
        best: tuple[int, Path] | None = None
        if not self.directory.is_dir():
            return None
        for path in self.directory.glob(f"rank-*{SUFFIX}"):
            seq = peek_seq(path)
            if seq is not None and (best is None or seq > best[0]):
                best = (seq, path)
        return best

    def remove_own(self) -> None:
        """Drop this rank's commit (the job finished: nothing to resume)."""
        self.path.unlink(missing_ok=True)
