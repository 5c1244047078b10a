"""Linux /sys: CPU topology, NUMA domains and network devices.

`read_tree` copies the few files needed from a /sys tree (the real one, or a recorded one with
`--sysfs-root`) into a dict keyed by path relative to the root; the other functions are pure and read only
that dict, so tests feed them a tree built in tmp_path.
"""

from __future__ import annotations

from pathlib import Path

from hpcring.errors import ProfileError
from hpcring.schedulers import cpuset
from hpcring.schedulers.local import describe_cpus
from hpcring.schedulers.profile_init.facts import CpuFacts, NicFact

Files = dict[str, str]
_GLOBS = (
    "devices/system/cpu/online",
    "devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    "devices/system/cpu/cpu[0-9]*/topology/core_id",
    "devices/system/node/node[0-9]*/cpulist",
    "class/infiniband/*/device/numa_node",
    "class/infiniband/*/ports/1/link_layer",
    "class/net/*/device/numa_node",
    "class/net/*/device/uevent",
    "class/net/*/type",
)


def read_tree(root: Path) -> Files:
    """The files the parsers use, relative to `root`; unreadable ones are left out (fact unknown)."""
    out: Files = {}
    for pattern in _GLOBS:
        for path in sorted(root.glob(pattern)):
            try:
                out[str(path.relative_to(root))] = path.read_text().strip()
            except OSError:
                continue
    return out


def _children(files: Files, prefix: str, suffix: str) -> dict[str, str]:
    """{name: text} for keys `prefix<name>suffix` (one path component as name)."""
    out = {}
    for key, text in files.items():
        if key.startswith(prefix) and key.endswith(suffix):
            name = key[len(prefix) : len(key) - len(suffix)]
            if "/" not in name:
                out[name] = text
    return out


def cpus(files: Files) -> CpuFacts | None:
    """CPU topology from cpuN/topology; None when /sys has no topology files (some containers)."""
    online = files.get("devices/system/cpu/online")
    if online is None:
        return None
    base = "devices/system/cpu/cpu"
    table: dict[int, tuple[int, int]] = {}
    for cpu in cpuset.parse(online):
        pkg = files.get(f"{base}{cpu}/topology/physical_package_id")
        core = files.get(f"{base}{cpu}/topology/core_id")
        if pkg is None or core is None:
            return None
        table[cpu] = (max(int(pkg), 0), int(core))
    try:
        node = describe_cpus(table)
    except ProfileError as exc:
        raise ProfileError(str(exc).replace("local:", "profiles init:", 1)) from exc
    ncores = node["sockets"] * node["cores_per_socket"]
    domains = _children(files, "devices/system/node/node", "/cpulist")
    numa = tuple(
        (int(n), tuple(sorted({_core_of(c, node, ncores) for c in cpuset.parse(text)})))
        for n, text in sorted(domains.items(), key=lambda kv: int(kv[0]))
        if text
    )
    return CpuFacts(
        node["sockets"], node["cores_per_socket"], node["threads_per_core"], node["thread_numbering"], numa
    )


def _core_of(cpu: int, node: dict[str, object], ncores: int) -> int:
    """The physical core owning hardware thread `cpu` (scatter: cpu mod cores; compact: cpu div threads)."""
    if node["thread_numbering"] == "compact":
        return cpu // int(str(node["threads_per_core"]))
    return cpu % ncores


def _numa(text: str | None) -> int | None:
    """A device's numa_node file: -1 (no affinity) and unreadable mean unknown."""
    if text is None or not text.lstrip("-").isdigit() or int(text) < 0:
        return None
    return int(text)


ARPHRD_INFINIBAND = "32"  # <linux/if_arp.h>: /sys/class/net/*/type of IPoIB interfaces


def nics(files: Files) -> tuple[list[NicFact], str | None]:
    """RDMA devices (/sys/class/infiniband) when there are any, else the physical network interfaces (those
    backed by a device); and the interconnect they show: "infiniband", "roce" (an RDMA port whose
    link_layer is Ethernet), or None (plain Ethernet, or a fabric /sys does not name, such as Slingshot)."""
    ib = _children(files, "class/infiniband/", "/device/numa_node")
    if ib:
        layers = set(_children(files, "class/infiniband/", "/ports/1/link_layer").values())
        kind = "roce" if layers == {"Ethernet"} else "infiniband"
        return [NicFact(name, _numa(text)) for name, text in sorted(ib.items())], kind
    backed = _children(files, "class/net/", "/device/uevent")  # a device behind it: not lo, bridges, veths
    numa = _children(files, "class/net/", "/device/numa_node")
    types = _children(files, "class/net/", "/type")
    found = [NicFact(n, _numa(numa.get(n))) for n in sorted(backed) if types.get(n) != ARPHRD_INFINIBAND]
    return found, None
