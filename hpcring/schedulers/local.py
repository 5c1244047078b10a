"""The `local` profile: this machine's topology, read from /sys (what `lscpu` reads), GPUs from nvidia-smi.

Detection writes ordinary profile YAML, which then goes through the same schema and cross-field checks as any
profile: a machine we cannot describe faithfully is refused rather than approximated.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from hpcring.errors import ProfileError
from hpcring.schedulers import cpuset

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_topology(root: Path = SYS_CPU) -> dict[int, tuple[int, int]]:
    """OS CPU number -> (package id, core id) for every online CPU."""
    online = _read(root / "online") or "0"
    out: dict[int, tuple[int, int]] = {}
    for cpu in cpuset.parse(online):
        topo = root / f"cpu{cpu}" / "topology"
        pkg = int(_read(topo / "physical_package_id") or 0)
        core = int(_read(topo / "core_id") or cpu)
        out[cpu] = (max(pkg, 0), core)
    return out


def describe_cpus(topo: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """Node keys (sockets, cores, threads and their numbering) from a CPU -> (package, core) table.

    Our model numbers physical cores socket by socket and hardware threads either compactly or in scatter
    order;
    anything else (holes, unequal sockets) cannot be expressed and raises ProfileError.
    """
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu, key in sorted(topo.items()):
        cores.setdefault(key, []).append(cpu)
    ordered = sorted(cores.values(), key=lambda threads: threads[0])
    packages = sorted({k[0] for k in cores})
    tpc = len(ordered[0])
    ncores = len(ordered)
    if any(len(t) != tpc for t in ordered) or ncores % len(packages):
        raise ProfileError(
            "local: cores have different thread counts or sockets differ; write a profile instead"
        )
    compact = all(t == [i * tpc + j for j in range(tpc)] for i, t in enumerate(ordered))
    scatter = all(t == [i + j * ncores for j in range(tpc)] for i, t in enumerate(ordered))
    if not (compact or scatter):
        raise ProfileError("local: CPU numbering is neither compact nor scatter; write a profile instead")
    return {
        "sockets": len(packages),
        "cores_per_socket": ncores // len(packages),
        "threads_per_core": tpc,
        "thread_numbering": "scatter" if scatter else "compact",
    }


def numa_domains(root: Path = SYS_NODE, threads_per_core: int = 1, ncores: int = 1) -> list[dict[str, Any]]:
    """NUMA domains with their physical cores (hardware threads folded back onto cores)."""
    out = []
    for d in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = cpuset.parse(_read(d / "cpulist") or "")
        cores = sorted({c % ncores for c in cpus})
        if cores:
            out.append({"id": int(d.name[4:]), "cores": cpuset.format_list(cores)})
    return out


def nvidia_gpus() -> list[dict[str, Any]]:
    """GPUs from nvidia-smi with the NUMA node of their PCI device; [] without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        res = subprocess.run(
            [exe, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in res.stdout.splitlines():
        index, _, bus = (s.strip() for s in line.partition(","))
        if not index.isdigit():
            continue
        numa = _read(Path("/sys/bus/pci/devices") / bus.lower()[-12:] / "numa_node")
        gpus.append(
            {"index": int(index), "numa": max(int(numa), 0) if numa and numa.lstrip("-").isdigit() else 0}
        )
    return gpus


def nics() -> tuple[list[dict[str, Any]], str]:
    """Physical network interfaces (those backed by a device) and the interconnect they imply."""
    out: list[dict[str, Any]] = []
    for dev in sorted(Path("/sys/class/net").glob("*")):
        if not (dev / "device").exists():
            continue
        numa = _read(dev / "device" / "numa_node")
        entry: dict[str, Any] = {"name": dev.name}
        if numa and numa.isdigit():
            entry["numa"] = int(numa)
        out.append(entry)
    interconnect = "infiniband" if Path("/sys/class/infiniband").is_dir() else "ethernet"
    return out, interconnect


def detect() -> dict[str, Any]:
    """The profile document for this machine."""
    node = describe_cpus(cpu_topology())
    ncores = node["sockets"] * node["cores_per_socket"]
    numa = numa_domains(threads_per_core=node["threads_per_core"], ncores=ncores)
    if numa:
        node["numa"] = numa
    gpus = nvidia_gpus()
    known = {d["id"] for d in numa} if numa else set(range(node["sockets"]))
    node["gpus"] = [g if g["numa"] in known else {**g, "numa": min(known)} for g in gpus]
    nic_list, interconnect = nics()
    node["nics"] = [n for n in nic_list if n.get("numa") is None or n["numa"] in known]
    node["interconnect"] = interconnect
    runtime = next((r for r in ("apptainer", "singularity") if shutil.which(r)), None)
    site: dict[str, Any] = {
        "scheduler": "slurm",
        "launcher": "srun",
        "mpi": "openmpi",
        "smt": 1,
        "binding": True,
        "container": {"runtime": runtime} if runtime else None,
    }
    return {
        "schema_version": 1,
        "name": "local",
        "description": "this machine, detected from /sys (and nvidia-smi when present)",
        "node": node,
        "site": site,
    }


def detect_yaml() -> str:
    """Detected profile as YAML text (hashed for the provenance header like any other profile)."""
    return "# hpcring local profile, detected\n" + yaml.safe_dump(detect(), sort_keys=False)
