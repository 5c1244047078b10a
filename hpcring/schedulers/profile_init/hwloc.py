"""hwloc's `lstopo --of xml`: packages, cores and their processing units, NUMA nodes.

The XML nests `<object type="Package|Core|PU|NUMANode" os_index=... cpuset=...>` elements (hwloc 2 and 3
alike); I/O objects are ignored here: GPUs and NICs come from /sys and the vendors' tools. Used where /sys has
no topology files, and to cross-check /sys where both exist.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hpcring.errors import ProfileError
from hpcring.schedulers import cpuset
from hpcring.schedulers.local import describe_cpus
from hpcring.schedulers.profile_init.facts import CpuFacts


def _bits(mask: str) -> list[int]:
    """OS indexes set in an hwloc cpuset such as "0x00555555" or "0x000000ff,0xffffffff"."""
    words = [w for w in mask.split(",") if w]
    value = 0
    for word in words:
        value = (value << 32) | int(word, 16)
    return [b for b in range(value.bit_length()) if value >> b & 1]


def cpus(xml_text: str) -> CpuFacts:
    """CPU topology from lstopo XML; ProfileError when the text is not hwloc XML or holds no cores."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ProfileError(f"profiles init: lstopo output is not XML: {exc}") from exc
    table: dict[int, tuple[int, int]] = {}
    numa: list[tuple[int, list[int]]] = []
    for pkg_pos, pkg in enumerate(root.iter("object")):
        if pkg.get("type") != "Package":
            continue
        package = int(pkg.get("os_index", pkg_pos))
        for core_pos, core_obj in enumerate(o for o in pkg.iter("object") if o.get("type") == "Core"):
            for pu in (o for o in core_obj.iter("object") if o.get("type") == "PU"):
                table[int(pu.get("os_index", "0"))] = (package, core_pos)
    for node in (o for o in root.iter("object") if o.get("type") == "NUMANode"):
        numa.append((int(node.get("os_index", "0")), _bits(node.get("cpuset", "0x0"))))
    if not table:
        raise ProfileError("profiles init: lstopo XML lists no Package/Core/PU objects")
    try:
        node_keys = describe_cpus(table)
    except ProfileError as exc:
        raise ProfileError(str(exc).replace("local:", "profiles init:", 1)) from exc
    ncores = node_keys["sockets"] * node_keys["cores_per_socket"]
    tpc = int(node_keys["threads_per_core"])
    compact = node_keys["thread_numbering"] == "compact"

    def core_of(cpu: int) -> int:
        return cpu // tpc if compact else cpu % ncores

    domains = tuple((i, tuple(sorted({core_of(c) for c in pus}))) for i, pus in sorted(numa) if pus)
    return CpuFacts(
        node_keys["sockets"], node_keys["cores_per_socket"], tpc, node_keys["thread_numbering"], domains
    )


def describe(facts: CpuFacts) -> str:
    """One line for comparing two sources."""
    doms = "; ".join(f"{i}: {cpuset.format_list(c)}" for i, c in facts.numa)
    return (
        f"{facts.sockets} x {facts.cores_per_socket} cores x {facts.threads_per_core} threads "
        f"({facts.thread_numbering}), NUMA {doms or 'unknown'}"
    )
