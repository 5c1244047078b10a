"""The libraries a shared object asks the dynamic loader for (DT_NEEDED), read from its ELF file.

Why our own reader: `hpcring doctor` must say whether an MPI library links Cray MPICH's GPU transfer library,
on machines that may lack binutils, without running the file (ldd may execute it). It reads the program
headers the loader reads (PT_LOAD, PT_DYNAMIC), not section headers, which a stripped file may lack. Every
offset and length comes from the file and is checked against its size before use: a truncated or hostile
file gives ElfError, never an IndexError or a read outside it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from hpcring.files import read_at_most

MAX_BYTES = 1 << 30  # larger than any shared object this reads; a bound on a hostile file
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_STRSZ, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 10, 15, 29


class ElfError(ValueError):
    """Not an ELF file this reader understands, or a malformed one."""


@dataclass(frozen=True)
class Dynamic:
    """What the dynamic section says: DT_NEEDED names in order, the SONAME, and the search path."""

    needed: tuple[str, ...]
    soname: str | None
    runpath: tuple[str, ...]  # DT_RUNPATH, else DT_RPATH, split at ':'


@dataclass(frozen=True)
class _Layout:
    data: bytes
    endian: str  # "<" or ">"
    wide: bool  # ELFCLASS64


def _unpack(lay: _Layout, fmt: str, offset: int) -> tuple[int, ...]:
    size = struct.calcsize(lay.endian + fmt)
    if offset < 0 or offset + size > len(lay.data):
        raise ElfError(f"truncated: {size} bytes at offset {offset} lie beyond the file's {len(lay.data)}")
    return struct.unpack_from(lay.endian + fmt, lay.data, offset)


def _layout(data: bytes) -> _Layout:
    if len(data) < 16 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file (no \\x7fELF magic)")
    if data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ElfError(f"unknown ELF class {data[4]} or data encoding {data[5]}")
    return _Layout(data, "<" if data[5] == 1 else ">", data[4] == 2)


def _segments(lay: _Layout) -> list[tuple[int, int, int, int]]:
    """(p_type, p_offset, p_vaddr, p_filesz) of every program header."""
    if lay.wide:
        (phoff,) = _unpack(lay, "Q", 0x20)
        phentsize, phnum = _unpack(lay, "HH", 0x36)
        fmt, need = "IIQQQQQQ", 56
    else:
        (phoff,) = _unpack(lay, "I", 0x1C)
        phentsize, phnum = _unpack(lay, "HH", 0x2A)
        fmt, need = "IIIIIIII", 32
    if phnum and phentsize < need:
        raise ElfError(f"program header entries of {phentsize} bytes; expected at least {need}")
    out = []
    for i in range(phnum):
        f = _unpack(lay, fmt, phoff + i * phentsize)
        if lay.wide:  # type, flags, offset, vaddr, paddr, filesz, memsz, align
            out.append((f[0], f[2], f[3], f[5]))
        else:  # type, offset, vaddr, paddr, filesz, memsz, flags, align
            out.append((f[0], f[1], f[2], f[4]))
    return out


def _file_offset(vaddr: int, loads: list[tuple[int, int, int, int]]) -> int:
    for _, offset, start, size in loads:
        if start <= vaddr < start + size:
            return vaddr - start + offset
    raise ElfError(f"address {vaddr:#x} (DT_STRTAB) lies in no loaded segment")


def _string(lay: _Layout, table: int, size: int, index: int) -> str:
    if index >= size:
        raise ElfError(f"string index {index} beyond the string table's {size} bytes")
    start = table + index
    end = lay.data.find(b"\0", start, min(table + size, len(lay.data)))
    if start >= len(lay.data) or end < 0:
        raise ElfError(f"unterminated string at offset {start}")
    return lay.data[start:end].decode("utf-8", "replace")


def parse(data: bytes) -> Dynamic:
    """The dynamic section of an ELF image (the file's bytes); an object without one needs nothing."""
    lay = _layout(data)
    segments = _segments(lay)
    dyn = [s for s in segments if s[0] == _PT_DYNAMIC]
    if not dyn:
        return Dynamic((), None, ())
    _, offset, _, size = dyn[0]
    fmt = "qQ" if lay.wide else "iI"
    step = struct.calcsize(lay.endian + fmt)
    entries: list[tuple[int, int]] = []
    for pos in range(offset, offset + size - step + 1, step):
        tag, value = _unpack(lay, fmt, pos)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    tags = dict(entries)  # the last of a repeated tag; only the string table's are single-valued anyway
    if _DT_STRTAB not in tags or _DT_STRSZ not in tags:
        raise ElfError("dynamic section without a string table (DT_STRTAB, DT_STRSZ)")
    table = _file_offset(tags[_DT_STRTAB], [s for s in segments if s[0] == _PT_LOAD])
    strsz = tags[_DT_STRSZ]

    def text(index: int) -> str:
        return _string(lay, table, strsz, index)

    path = tags.get(_DT_RUNPATH, tags.get(_DT_RPATH))
    return Dynamic(
        needed=tuple(text(v) for t, v in entries if t == _DT_NEEDED),
        soname=text(tags[_DT_SONAME]) if _DT_SONAME in tags else None,
        runpath=tuple(p for p in text(path).split(":") if p) if path is not None else (),
    )


def read(path: str | Path) -> Dynamic:
    """The dynamic section of the ELF file at `path` (ElfError when it is not one, or is too large)."""
    p = Path(path)
    try:
        data = read_at_most(p, MAX_BYTES)
    except OSError as exc:
        raise ElfError(f"{p}: cannot be read: {exc.strerror or exc}") from exc
    if data is None:
        raise ElfError(f"{p}: larger than {MAX_BYTES} bytes; not a shared object this reads")
    try:
        return parse(data)
    except ElfError as exc:
        raise ElfError(f"{p}: {exc}") from exc
