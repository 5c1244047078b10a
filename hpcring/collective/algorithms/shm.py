"""Allreduce inside one node through a shared-memory segment (docs/dev/collectives.md, "Shared memory").

Every rank maps one segment: a slot per rank and a result region. A round: every rank copies its input into
its own slot; node barrier; rank r reduces part r (`chunks.bounds`) of all the slots into the result region
and applies the caller's finishing step (AVERAGE's scaling) to it; node barrier; every rank copies the result
out. One copy in, one out and two barriers, where a ring over MPI adds MPI's own copies and n-1 dependent
steps; the engine packs a fused batch straight into the slot, with no fusion buffer in between. A contiguous
buffer (`shm_allreduce`) moves less: nobody but rank r reads part r of rank r's input, so rank r reduces it
where it lies and only the other parts go in and out. Operands are combined in rank order either way, so
both rounds give the same bits.

One set of buffers is enough: a rank rewrites its slot only after the round's second barrier, the result
region only after the next round's first. The segment is a file in /dev/shm (or $HPCRING_SHM_DIR), reserved
in full (`posix_fallocate`: ENOSPC now rather than SIGBUS on first touch) and unlinked once every rank has
mapped it, so a killed rank leaves nothing behind. Creation is agreed: if any rank cannot map it, every rank
gets False and the caller uses the ring. Ranks read each other's plain stores only after an MPI barrier both
passed, whose shared-memory implementation publishes with release/acquire atomics (the assumption oneCCL and
DeepSpeed's CPU allreduce also make).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcring.collective.algorithms.chunks import bounds
from hpcring.collective.ops import ReduceOp, ufunc
from hpcring.collective.progress import wait_yielding
from hpcring.collective.selection import env_bytes

NDArray = np.ndarray[Any, Any]
SHM_DIR = "/dev/shm"
DIR_ENV = "HPCRING_SHM_DIR"
SLOT_ENV = "HPCRING_SHM_SLOT_BYTES"
DEFAULT_SLOT_BYTES = 16 << 20
_MIN_SLOT_BYTES = 1 << 20
_ALIGN = 4096  # slots start on page boundaries: no false sharing between ranks, aligned for any dtype

Fill = Callable[[NDArray], None]  # writes this rank's input into the slot view it is given
Drain = Callable[[NDArray], None]  # copies the reduced result out of the view it is given
Finish = Callable[[NDArray], None]  # applied by its owner to each reduced part (AVERAGE's scaling)


def shm_dir() -> str:
    """Where segments are created: $HPCRING_SHM_DIR (any tmpfs the node's ranks share), else /dev/shm."""
    return os.environ.get(DIR_ENV, "").strip() or SHM_DIR


def slot_limit() -> int:
    """Largest slot, bytes: $HPCRING_SHM_SLOT_BYTES (default 16 MiB). Bigger buffers go in rounds."""
    allowed = f"an integer of at least {_MIN_SLOT_BYTES}"
    return env_bytes(SLOT_ENV, DEFAULT_SLOT_BYTES, _MIN_SLOT_BYTES, allowed)


class SharedSegment:
    """The shared-memory segment of one group of ranks on one node (see the module docstring).

    Owned by a Topology; every method that creates or grows it is collective over `comm`, and is called by
    all ranks with the same sizes (the agreed shapes of an allreduce), so they grow it at the same call."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.slot_bytes = 0  # capacity of each slot (and of the result region)
        self.unavailable: str | None = None  # why the group cannot use shared memory (agreed by all ranks)
        self._map: mmap.mmap | None = None
        self._bytes: NDArray | None = None

    def ensure(self, nbytes: int) -> bool:
        """Make every slot hold `nbytes` (collective when it has to grow); False if shared memory cannot be
        used by this group, the same answer on every rank."""
        if self.unavailable is not None:
            return False
        if nbytes <= self.slot_bytes:
            return True
        want = max(nbytes, min(2 * self.slot_bytes, slot_limit()))
        self._grow(-(-want // _ALIGN) * _ALIGN)
        return self.unavailable is None

    def _grow(self, slot_bytes: int) -> None:
        total = slot_bytes * (self.size + 1)
        self.close()
        path, why = self._create(total) if self.rank == 0 else (None, None)
        path, why = self.comm.bcast((path, why), root=0)
        mapped, err = (None, why) if path is None else _map_file(path, total)
        failures = [e for e in self.comm.allgather(err) if e]  # also: every rank has mapped it
        if self.rank == 0 and path is not None:
            _unlink(path)
        if failures:
            if mapped is not None:
                mapped.close()
            self.unavailable = failures[0]
            return
        assert mapped is not None
        self._map = mapped
        self._bytes = np.frombuffer(mapped, dtype=np.uint8)
        self.slot_bytes = slot_bytes

    def _create(self, total: int) -> tuple[str | None, str | None]:
        """(path, None) of a new file of `total` reserved bytes, or (None, why not)."""
        where = shm_dir()
        if not os.path.isdir(where):
            return None, f"{where} does not exist"
        path = os.path.join(where, f"hpcring-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            return None, f"cannot create {path}: {exc.strerror}"
        try:
            os.posix_fallocate(fd, 0, total)
        except OSError as exc:
            _unlink(path)
            return None, f"cannot reserve {total} bytes in {where}: {exc.strerror}"
        finally:
            os.close(fd)
        return path, None

    def view(self, region: int, count: int, dtype: np.dtype[Any]) -> NDArray:
        """`count` items of `dtype` at the start of region `region` (0..size-1: slots, size: the result)."""
        assert self._bytes is not None
        start = region * self.slot_bytes
        return self._bytes[start : start + count * dtype.itemsize].view(dtype)

    def barrier(self) -> None:
        """Node barrier, polled (progress.wait_polled) so waiting ranks leave the cores to the late ones."""
        wait_yielding(self.comm.Ibarrier())

    def close(self) -> None:
        """Unmap (local; the file is already unlinked). The object can grow again afterwards."""
        self._bytes = None
        if self._map is not None:
            # Views still alive (say, in an exception's traceback) keep the mapping: it is unmapped when the
            # last one is freed, instead of a BufferError here.
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        self.slot_bytes = 0


def _map_file(path: str, total: int) -> tuple[mmap.mmap | None, str | None]:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        where = os.path.dirname(path)
        return None, f"cannot open {path} on every rank ({exc.strerror}): the ranks do not share {where}"
    try:
        return mmap.mmap(fd, total), None
    except (OSError, ValueError) as exc:
        return None, f"cannot map {path}: {exc}"
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def shm_round(
    seg: SharedSegment,
    count: int,
    dtype: np.dtype[Any],
    op: ReduceOp,
    fill: Fill,
    drain: Drain,
    finish: Finish | None = None,
) -> None:
    """One round for `count` items (`count * itemsize <= seg.slot_bytes`, after `seg.ensure`): `fill` this
    rank's slot, reduce this rank's part of all slots with `op`'s base operator, `drain` the result."""
    n, r = seg.size, seg.rank
    fill(seg.view(r, count, dtype))
    seg.barrier()
    part = bounds(count, n)
    lo, hi = part[r], part[r + 1]
    if hi > lo:
        out = seg.view(n, count, dtype)[lo:hi]
        _combine_in_order(out, [seg.view(j, count, dtype)[lo:hi] for j in range(n)], op, dtype)
        if finish is not None:
            finish(out)
    seg.barrier()
    drain(seg.view(n, count, dtype))


def shm_allreduce(
    seg: SharedSegment,
    src: NDArray,
    dst: NDArray,
    op: ReduceOp,
    round_bytes: int | None = None,
    finish: Finish | None = None,
) -> bool:
    """dst = reduction of every rank's src (1-D, same size; dst may be src) with `op`'s base operator, then
    `finish` (applied by each part's owner to its part: AVERAGE's scaling is one pass over 1/n of the buffer
    per rank), in rounds of at most `slot_limit()` bytes, or `round_bytes` where smaller (a smaller segment:
    it is mapped by every rank and counts in each one's resident memory). False, with nothing done, if the
    group cannot use shared memory (then the caller runs another algorithm)."""
    limit = slot_limit() if round_bytes is None else min(round_bytes, slot_limit())
    step = max(1, limit // src.dtype.itemsize)
    if not seg.ensure(min(src.size, step) * src.dtype.itemsize):
        return False
    for lo in range(0, src.size, step):
        _direct_round(seg, src[lo : lo + step], dst[lo : lo + step], op, finish)
    return True


def _direct_round(
    seg: SharedSegment, src: NDArray, dst: NDArray, op: ReduceOp, finish: Finish | None
) -> None:
    """One round of a contiguous buffer (module docstring): only the parts other ranks reduce go through
    this rank's slot, and only theirs come back out of the result region."""
    n, r = seg.size, seg.rank
    count, dtype = src.size, src.dtype
    part = bounds(count, n)
    lo, hi = part[r], part[r + 1]
    slot = seg.view(r, count, dtype)
    _copy_outside(slot, src, lo, hi)
    seg.barrier()
    if hi > lo:
        result = seg.view(n, count, dtype)[lo:hi]
        operands = [src[lo:hi] if j == r else seg.view(j, count, dtype)[lo:hi] for j in range(n)]
        _combine_in_order(result, operands, op, dtype)
        if finish is not None:
            finish(result)
        np.copyto(dst[lo:hi], result)  # in place too: no other rank reads this rank's own buffer
    seg.barrier()
    _copy_outside(dst, seg.view(n, count, dtype), lo, hi)


def _copy_outside(dst: NDArray, src: NDArray, lo: int, hi: int) -> None:
    """dst = src everywhere but [lo, hi)."""
    if lo > 0:
        np.copyto(dst[:lo], src[:lo])
    if hi < src.size:
        np.copyto(dst[hi:], src[hi:])


def _combine_in_order(out: NDArray, operands: list[NDArray], op: ReduceOp, dtype: np.dtype[Any]) -> None:
    """out = operands[0] op operands[1] op ... in rank order (the general round's order, so the same bits)."""
    if len(operands) == 1:
        np.copyto(out, operands[0])
        return
    combine = ufunc(op, dtype)
    combine(operands[0], operands[1], out=out)
    for operand in operands[2:]:
        combine(out, operand, out=out)
