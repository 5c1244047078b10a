"""`hpcring doctor` in the real environments, and with mpi4py / torch blocked in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import ROOT, flavour_python

from hpcring.diagnostics import cpu_topology

BLOCK = (
    "import sys\nfor m in {mods}: sys.modules[m] = None\nfrom hpcring.cli import main\nsys.exit(main({argv}))"
)


def doctor(*argv: str, python: str = sys.executable, block: tuple[str, ...] = ()) -> tuple[int, str, str]:
    code = BLOCK.format(mods=list(block), argv=["doctor", *argv])
    proc = subprocess.run(
        ["timeout", "120", python, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


def as_json(out: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(out)
    return data


def test_full_environment() -> None:
    rc, out, err = doctor("--json", "--strict")
    assert rc == 0, err
    report = as_json(out)
    assert report["mpi"]["flavour"] == "openmpi" and report["mpi"]["launcher_version"].startswith(
        "mpiexec (Open MPI) 5"
    )
    assert report["mpi4py"]["version"].startswith("4.") and "Open MPI" in report["mpi4py"]["library_version"]
    assert report["torch"]["version"].startswith("2.13.0")
    assert report["torch"]["backends"] == {"gloo": True, "nccl": False, "mpi": False}
    assert report["gpus"]["count"] == 0
    assert report["host"]["threads"] == os.cpu_count() and report["host"]["cores"] >= 1
    assert report["missing"] == []


def test_the_torch_reader_is_reported_and_a_missing_one_with_the_fix() -> None:
    """Here make setup built the torch reader (`tensors:` says so); where it cannot load, the submit reads
    tensors through torch's attributes and the reader is listed as missing with the line that builds it."""
    rc, out, err = doctor()
    assert rc == 0, err
    assert "tensors:  read through torch's C++ API (the torch reader, built against torch 2.13.0" in out
    rc, out, err = doctor("--json", block=("hpcring.engine.core._torch_reader",))
    assert rc == 0, err
    report = as_json(out)
    assert report["core"]["reader"].startswith("torch's Python attributes (")
    [missing] = report["missing"]
    assert missing["what"].startswith("hpcring's torch reader") and "--no-build-isolation" in missing["fix"]


def test_missing_mpi4py_and_torch_are_reported_with_the_fix() -> None:
    rc, out, err = doctor(block=("mpi4py", "torch"))
    assert rc == 0, err
    assert "mpi4py:   missing" in out and "torch:    missing" in out
    assert "  - mpi4py: pip install 'hpcring[mpich]'" in out
    assert "  - torch: pip install 'hpcring[torch]'" in out
    rc, out, _ = doctor("--json", "--strict", block=("mpi4py", "torch"))
    assert rc == 1
    assert [m["what"] for m in as_json(out)["missing"]] == ["mpi4py", "torch"]


def test_mpich_environment() -> None:
    rc, out, err = doctor("--json", python=flavour_python("mpich"))
    assert rc == 0, err
    report = as_json(out)
    assert report["mpi"]["flavour"] == "mpich" and "MPICH" in report["mpi4py"]["library_version"]
    has_torch = subprocess.run([flavour_python("mpich"), "-c", "import torch"], check=False).returncode == 0
    assert report["torch"]["available"] is has_torch  # reported either way (make setup installs torch)


def test_topology_from_a_sysfs_tree(tmp_path: Path) -> None:
    """2 sockets x 2 cores x 2 threads, 2 NUMA nodes, one CPU offline (no topology directory)."""
    for cpu in range(9):
        d = tmp_path / "cpu" / f"cpu{cpu}"
        d.mkdir(parents=True)
        if cpu == 8:
            continue
        (d / "topology").mkdir()
        (d / "topology" / "physical_package_id").write_text(f"{cpu // 4}\n")
        (d / "topology" / "core_id").write_text(f"{(cpu // 2) % 2}\n")
    for node in range(2):
        (tmp_path / "node" / f"node{node}").mkdir(parents=True)
    assert cpu_topology(tmp_path) == {
        "source": "sysfs",
        "sockets": 2,
        "cores": 4,
        "threads": 8,
        "numa_nodes": 2,
    }


def test_shared_memory_directory_is_reported(tmp_path: Path) -> None:
    """Where the shm allreduce's segment goes and the room there; a directory that does not exist is missing,
    with the fix (strict mode then exits 1)."""
    rc, out, err = doctor("--json", "--strict")
    shm = as_json(out)["shared_memory"]
    assert rc == 0 and shm["dir"] == "/dev/shm" and shm["exists"] and shm["free_bytes"] > 0, err
    assert shm["slot_bytes"] == 16 << 20
    env = {**os.environ, "HPCRING_SHM_DIR": str(tmp_path / "none"), "HPCRING_SHM_SLOT_BYTES": str(4 << 20)}
    proc = subprocess.run(
        ["timeout", "120", sys.executable, "-m", "hpcring", "doctor", "--strict"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"shm:      {tmp_path / 'none'} does not exist (the shm allreduce uses the ring)" in proc.stdout
    assert "set HPCRING_SHM_DIR to one every rank of a node shares" in proc.stdout


def test_cray_gpu_mpi_check() -> None:
    """On a Cray node (CRAY_MPICH_DIR set), the doctor reads the loaded mpi4py's MPI module and libmpi: the
    wheels link no libmpi_gtl_*, so MPICH_GPU_SUPPORT_ENABLED=1 is reported as missing it (strict: 1)."""
    base = {**os.environ, "CRAY_MPICH_DIR": "/opt/cray/pe/mpich/9.0.1"}
    base.pop("MPICH_GPU_SUPPORT_ENABLED", None)
    for env, code in ((base, 0), ({**base, "MPICH_GPU_SUPPORT_ENABLED": "1"}, 1)):
        proc = subprocess.run(
            ["timeout", "120", sys.executable, "-m", "hpcring", "doctor", "--json", "--strict"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == code, proc.stderr
        check = as_json(proc.stdout)["cray_gpu_mpi"]
        assert check["cray"] == "CRAY_MPICH_DIR=/opt/cray/pe/mpich/9.0.1" and check["linked"] is False
        names = {Path(p).name for p in check["objects"]}
        assert "libmpi.so.40" in names and any(n.startswith("MPI.openmpi") for n in names)
    assert as_json(proc.stdout)["missing"][0]["what"] == "a program Cray MPICH can start with GPU support"
