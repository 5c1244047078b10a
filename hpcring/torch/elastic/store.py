"""Commits in node-local memory: two files per rank in a tmpfs directory (`/dev/shm`), each commit atomic.

Why files and not an in-memory copy (Horovod's): hpcring re-forms a world by restarting its processes (MPI
cannot shrink a running world), so a commit must outlive the process that made it. A file on tmpfs is memory
all the same: writing one is a single copy of each tensor's bytes, about what `tensor.clone()` costs, and it
survives the process. The next world restores the newest commit of any node. The API, also used by
`hpcring.ray`: docs/dev/elastic.md, "Commit store API".

Format: 8-byte magic (written last), 8-byte header length, 8-byte data offset, a pickled header (sequence
number, the state's structure with each tensor replaced by a reference, each tensor's dtype/shape/offset),
then the raw tensor bytes, each aligned to 64 bytes. Readers get tensors that view one buffer; nothing is
unpickled from tensor data. A committed object is any nesting of dicts, lists and tuples whose leaves are
tensors or picklable values.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcring import _deps, files

MAGIC = b"HPCRCMT1"
_LEN = struct.Struct("<Q")
_FIXED = len(MAGIC) + 2 * _LEN.size  # magic, header length, offset of the tensor data
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


def _flat(tensor: Any) -> Any:
    """The tensor's bytes as a flat uint8 CPU tensor (a view, without a copy, of a contiguous CPU tensor)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    torch = _deps.torch()
    return t.contiguous().reshape(-1).view(torch.uint8)


@dataclass(frozen=True)
class Layout:
    """Where everything of one commit goes: the header, then each tensor's bytes at its offset."""

    header: bytes
    flats: list[Any]
    offsets: list[int]
    size: int


def layout(seq: int, obj: Any) -> Layout:
    """Lay out a commit of `obj` without copying any tensor yet."""
    tensors: list[Any] = []
    skeleton = _strip(obj, tensors)
    flats = [_flat(t) for t in tensors]
    table, offset = [], 0
    for t, flat in zip(tensors, flats, strict=True):
        table.append((str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, flat.numel()))
        offset += flat.numel() + _pad(flat.numel())
    header = pickle.dumps({"seq": seq, "skeleton": skeleton, "tensors": table}, protocol=5)
    base = _FIXED + len(header)
    base += _pad(base)
    return Layout(header, flats, [base + entry[2] for entry in table], base + offset)


def fill(buffer: Any, lay: Layout) -> None:
    """Write the commit into `buffer` (at least lay.size bytes): invalidate it, copy the tensors, write the
    header, and validate it last, so a writer killed half way leaves a buffer that reads as no commit."""
    torch = _deps.torch()
    mv = memoryview(buffer)
    mv[: len(MAGIC)] = bytes(len(MAGIC))
    for flat, offset in zip(lay.flats, lay.offsets, strict=True):
        if flat.numel():
            torch.frombuffer(buffer, dtype=torch.uint8, count=flat.numel(), offset=offset).copy_(flat)
    base = lay.offsets[0] if lay.offsets else _FIXED + len(lay.header)
    mv[len(MAGIC) : _FIXED] = _LEN.pack(len(lay.header)) + _LEN.pack(base)
    mv[_FIXED : _FIXED + len(lay.header)] = lay.header
    mv[: len(MAGIC)] = MAGIC


def encode_bytes(seq: int, obj: Any) -> bytearray:
    """The whole commit in one buffer (kept in memory, or broadcast by sync())."""
    lay = layout(seq, obj)
    out = bytearray(lay.size)
    fill(out, lay)
    return out


def decode(buffer: bytes | bytearray | memoryview | Any) -> tuple[int, Any]:
    """(seq, obj) from a commit's bytes; the tensors view `buffer` (copy them before reusing it)."""
    torch = _deps.torch()
    mv = memoryview(buffer).cast("B")
    if bytes(mv[: len(MAGIC)]) != MAGIC:
        raise ValueError("not an hpcring commit (bad magic)")
    (hlen,) = _LEN.unpack_from(mv, len(MAGIC))
    (base,) = _LEN.unpack_from(mv, len(MAGIC) + _LEN.size)
    header = pickle.loads(mv[_FIXED : _FIXED + hlen])
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
            head = f.read(_FIXED)
            if head[: len(MAGIC)] != MAGIC:
                return None
            (hlen,) = _LEN.unpack_from(head, len(MAGIC))
            return int(pickle.loads(f.read(hlen))["seq"])
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, KeyError, struct.error):
        return None


def write_file(fd: int, lay: Layout) -> None:
    """`fill` for an open file of lay.size bytes, with checked writes: invalidate, write the tensors and the
    header, fsync, validate last (a writer killed half way, or a failed write, leaves no commit)."""
    files.write_at(fd, bytes(len(MAGIC)), 0)
    for flat, offset in zip(lay.flats, lay.offsets, strict=True):
        if flat.numel():
            files.write_at(fd, flat.numpy(), offset)
    base = lay.offsets[0] if lay.offsets else _FIXED + len(lay.header)
    files.write_at(fd, _LEN.pack(len(lay.header)) + _LEN.pack(base) + lay.header, len(MAGIC))
    os.fsync(fd)
    files.write_at(fd, MAGIC, 0)


class CommitStore:
    """The commit files of one node's ranks in `directory`.

    This rank keeps two files, `rank-<r>.0.commit` and `rank-<r>.1.commit`, open for as long as the store
    lives, and overwrites the older one at each commit: after the first commit a commit is a copy into space
    the file system already gave it, and the other file holds the previous commit while one is written.
    Never memory-mapped: a mapped page the file system cannot back (a full tmpfs) is a SIGBUS, not an error.
    The space is reserved when a file takes its size (`files.reserve`), so a full disk is a DiskFullError
    there, naming the folder and the bytes needed, and every write after it is checked too."""

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.paths = [self.directory / f"rank-{rank}.{slot}{SUFFIX}" for slot in (0, 1)]
        self._fds: dict[int, tuple[int, int]] = {}  # slot -> (open descriptor, size reserved)
        # Overwrite the older of the two files a previous world may have left, never the newer.
        self._seqs = [s if (s := peek_seq(p)) is not None else -1 for p in self.paths]
        self.path = self.paths[0]  # the last commit written by this rank

    def write(self, seq: int, obj: Any) -> Path:
        """Write the commit into the older of this rank's two files (DiskFullError when it does not fit)."""
        lay = layout(seq, obj)
        slot = 0 if self._seqs[0] <= self._seqs[1] else 1
        self._seqs[slot] = -1
        try:
            write_file(self._file(slot, lay.size), lay)
        except OSError as exc:
            self._drop(slot)  # free what the failed commit took: the other file keeps the last good one
            err = files.disk_full(exc, "an elastic commit (HPCRING_ELASTIC_DIR)", self.directory, lay.size)
            if err is exc:
                raise
            raise err from exc
        self._seqs[slot] = seq
        self.path = self.paths[slot]
        return self.path

    def _file(self, slot: int, size: int) -> int:
        current = self._fds.get(slot)
        if current is not None and current[1] == size:
            return current[0]
        self.directory.mkdir(parents=True, exist_ok=True)
        if current is None:
            fd = os.open(self.paths[slot], os.O_RDWR | os.O_CREAT, 0o600)
            self._fds[slot] = (fd, -1)
        else:
            fd = current[0]
        files.reserve(fd, size)
        self._fds[slot] = (fd, size)
        return fd

    def _drop(self, slot: int) -> None:
        """Close and empty a slot's file after a failed commit (no half commit, no space held)."""
        current = self._fds.pop(slot, None)
        if current is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(current[0], 0)
            os.close(current[0])

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
        """Drop this rank's commits (the job finished: nothing to resume)."""
        for fd, _size in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for path in self.paths:
            path.unlink(missing_ok=True)
