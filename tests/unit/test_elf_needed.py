"""DT_NEEDED from real ELF files (the MPI wheels' libmpi and mpi4py's MPI modules), the Cray GTL check's
logic on them, and a malformed or truncated file giving ElfError, never another exception."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from hpcring import cray_gtl, elf_needed

LIB = Path(sys.prefix) / "lib"


def _libmpi() -> Path:
    """The Open MPI wheel's libmpi in this environment (the project's set-up installs it)."""
    found = sorted(LIB.glob("libmpi.so.*"))
    assert found, f"no libmpi.so.* in {LIB}: the environment lacks the MPI wheel"
    return found[0]


def _mpi4py_modules() -> list[Path]:
    import mpi4py

    found = sorted(Path(mpi4py.__file__).parent.glob("MPI*.so"))
    assert found, "mpi4py without a compiled MPI module"
    return found


def test_wheel_libmpi_links_no_gtl() -> None:
    """The wheel's libmpi: its soname, its $ORIGIN run path, libfabric among its needs, no libmpi_gtl_*."""
    dyn = elf_needed.read(_libmpi())
    assert dyn.soname is not None and dyn.soname.startswith("libmpi.so.")
    assert "libfabric.so.1" in dyn.needed and "libc.so.6" in dyn.needed
    assert "$ORIGIN" in dyn.runpath
    assert not any(n.startswith(cray_gtl.GTL_PREFIX) for n in dyn.needed)


def test_mpi4py_modules_need_their_libmpi() -> None:
    """mpi4py 4's wheel carries one MPI module per ABI: each needs that ABI's libmpi and no GTL."""
    needs = {p.name.split(".")[1]: elf_needed.read(p).needed for p in _mpi4py_modules()}
    assert "libmpi.so.12" in needs["mpich"] and "libmpi.so.40" in needs["openmpi"]
    report = cray_gtl.check([str(p) for p in _mpi4py_modules()] + [str(_libmpi())], {}, "PE_ENV=GNU")
    assert report.linked is False and len(report.objects) == 3
    assert "no libmpi_gtl_* in" in cray_gtl.summary(report)


def _with_gtl(src: Path, dst: Path) -> Path:
    """A copy of a real libmpi whose longest DT_NEEDED name is rewritten, in place in its string table, as
    libmpi_gtl_hsa.so.0 (NUL-padded): what a libmpi linked with Cray's GPU transfer library asks for."""
    gtl = b"libmpi_gtl_hsa.so.0"
    longest = max(elf_needed.read(src).needed, key=len).encode()
    assert len(longest) >= len(gtl), longest
    data = src.read_bytes().replace(longest + b"\0", gtl + b"\0" * (len(longest) - len(gtl) + 1))
    dst.write_bytes(data)
    return dst


def test_gtl_in_needed_is_found(tmp_path: Path) -> None:
    lib = _with_gtl(_libmpi(), tmp_path / "libmpi.so.12")
    assert "libmpi_gtl_hsa.so.0" in elf_needed.read(lib).needed
    report = cray_gtl.check(
        [str(lib)], {"MPICH_GPU_SUPPORT_ENABLED": "1"}, "CRAY_MPICH_DIR=/opt/cray/pe/mpich"
    )
    assert report.linked is True and report.gtl == [f"libmpi_gtl_hsa.so.0 (needed by {lib})"]
    assert cray_gtl.advice(report) is None and "--gpu-aware-mpi is safe" in cray_gtl.summary(report)


def test_advice_when_gpu_support_meets_no_gtl() -> None:
    report = cray_gtl.check([str(_libmpi())], {"MPICH_GPU_SUPPORT_ENABLED": "1"}, "PE_ENV=GNU")
    advice = cray_gtl.advice(report)
    assert advice is not None and "Cray MPICH will abort at start" in advice
    assert cray_gtl.advice(cray_gtl.check([str(_libmpi())], {}, "PE_ENV=GNU")) is None


def test_a_preloaded_gtl_counts_and_maps_are_parsed() -> None:
    maps = (
        "7f00-7f01 r--p 00000000 08:01 1 /opt/cray/pe/lib64/libmpi_gtl_hsa.so.0\n"
        "7f01-7f02 r-xp 00001000 08:01 1 /opt/cray/pe/lib64/libmpi_gtl_hsa.so.0\n"
        f"7f02-7f03 r--p 00000000 08:01 2 {_libmpi()}\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n"
    )
    paths = cray_gtl.mapped_objects(maps)
    assert paths == ["/opt/cray/pe/lib64/libmpi_gtl_hsa.so.0", str(_libmpi())]
    report = cray_gtl.check(paths, {}, "PE_ENV=CRAY")
    assert report.linked is True and report.gtl[0].startswith("libmpi_gtl_hsa.so.0 (loaded")


def test_cray_node_detection(tmp_path: Path) -> None:
    assert cray_gtl.cray_node({"CRAY_MPICH_DIR": "/opt/cray/pe/mpich/9.0.1"}, tmp_path) is not None
    assert cray_gtl.cray_node({"PE_ENV": "GNU"}, tmp_path) == "PE_ENV=GNU"
    assert cray_gtl.cray_node({}, tmp_path) is None
    (tmp_path / "opt" / "cray").mkdir(parents=True)
    assert cray_gtl.cray_node({}, tmp_path) == "/opt/cray exists"


def test_malformed_files_give_elf_error(tmp_path: Path) -> None:
    """Truncations and byte flips of a real file's headers: a Dynamic or ElfError, nothing else."""
    data = _libmpi().read_bytes()[: 1 << 20]
    with pytest.raises(elf_needed.ElfError, match="not an ELF file"):
        elf_needed.parse(b"#!/bin/sh\n")
    for cut in (0, 4, 16, 40, 64, 100, 4096):
        with pytest.raises(elf_needed.ElfError):
            elf_needed.parse(data[:cut])
    rng = random.Random(33)
    outcomes = {"parsed": 0, "refused": 0}
    for _ in range(300):
        bad = bytearray(data[:65536])
        for _ in range(rng.randint(1, 8)):
            bad[rng.randrange(16, 256)] = rng.randrange(256)
        try:
            elf_needed.parse(bytes(bad))
            outcomes["parsed"] += 1
        except elf_needed.ElfError:
            outcomes["refused"] += 1
    assert sum(outcomes.values()) == 300 and outcomes["refused"] > 0, outcomes
    missing = tmp_path / "none.so"
    with pytest.raises(elf_needed.ElfError, match="cannot be read"):
        elf_needed.read(missing)
