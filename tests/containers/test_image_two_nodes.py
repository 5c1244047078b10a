"""Two containers of the CPU image as two nodes: each joins its own fake node's network namespace
(ci/netns-cluster.sh; `podman run --network ns:/run/netns/NODE --hostname NODE`), and `hpcring run -H` in the
first starts ranks in both, so the launcher, Open MPI's wire-up and the collectives cross a real TCP link.

Open MPI starts its daemon on the second node through an ssh-like agent. Inside the first container that
agent is in_image/podman_rsh.py; it hands the command to ExecRelay on the host (over a bind-mounted socket),
which runs it with `podman exec` in the second container: every MPI binary and path is the image's own.
Opt-in like the other image tests (HPCRING_TEST_PODMAN=1, root); also needs `ip netns` and `unshare`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from podman_images import BUILD_TIMEOUT, IMAGE, IMAGE_UID, ROOT, Containers, ExecRelay, output, podman
from support import link_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

IN_IMAGE = Path(__file__).resolve().parent / "in_image"
CLUSTER_SH = ROOT / "ci" / "netns-cluster.sh"
PREFIX = f"hc{os.getpid()}n"  # per session: a developer's cluster and the netns tests' are left alone
SUBNET = "10.200.0"
RANKS_PER_NODE = 2
BIG = 8 << 20  # must match in_image/two_nodes.py


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCRING_NETNS_PREFIX": PREFIX, "HPCRING_NETNS_SUBNET": SUBNET}
    return subprocess.run(
        ["timeout", "120", str(CLUSTER_SH), *args], capture_output=True, text=True, env=env, check=False
    )


def reap_stale() -> None:
    """Tear down clusters of sessions killed before their teardown (the pid in the prefix is gone)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    for match in re.finditer(r"^(hc(\d+)n)fabric\b", listing.stdout, re.M):
        if not Path(f"/proc/{match.group(2)}").exists():
            env = {**os.environ, "HPCRING_NETNS_PREFIX": match.group(1)}
            subprocess.run(
                ["timeout", "120", str(CLUSTER_SH), "down"], env=env, capture_output=True, check=False
            )


@dataclass(frozen=True)
class Nodes:
    """Node (= hostname) -> its long-running container, and the relay that starts commands in them."""

    containers: dict[str, str]
    relay: ExecRelay


@pytest.fixture
def two_nodes(containers: Containers, tmp_path: Path) -> Iterator[Nodes]:
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"'{tool}' not found (apt-get install iproute2 util-linux)")
    reap_stale()
    up = cluster("up", "2")
    if up.returncode != 0:
        cluster("down", "2")
        pytest.fail(f"ci/netns-cluster.sh up 2 failed:\n{up.stdout}\n{up.stderr}")
    nodes = [f"{PREFIX}{i}" for i in (1, 2)]
    names = {node: containers.name() for node in nodes}
    relay: ExecRelay | None = None
    try:
        relay = ExecRelay(tmp_path / "relay", names)
        hosts = [f"--add-host={node}:{SUBNET}.{i}" for i, node in enumerate(nodes, 1)]
        for node, name in names.items():
            argv = ["run", "-d", "--rm", "--network", f"ns:/run/netns/{node}", "--hostname", node, *hosts]
            argv += [*containers.options(name, 600), "-v", f"{IN_IMAGE}:/tests:ro"]
            argv += ["-v", f"{relay.path.parent}:/run/hpcring-rsh", IMAGE, "sleep", "600"]
            started = podman(*argv, timeout=120)
            if started.returncode != 0:
                pytest.fail(f"container for {node} did not start:\n{output(started)}")
        yield Nodes(names, relay)
    finally:
        if relay is not None:
            relay.close()
        containers.remove(*names.values())
        down = cluster("down", "2")
        sys.stderr.write(f"\n[podman] 2 nodes down rc={down.returncode} {down.stderr.strip()}\n")


def test_two_containers_two_nodes(two_nodes: Nodes) -> None:
    first, second = two_nodes.containers
    np_total = 2 * RANKS_PER_NODE
    hosts = f"{first}:{RANKS_PER_NODE},{second}:{RANKS_PER_NODE}"
    command = ["hpcring", "run", "-np", str(np_total), "-H", hosts, "--rsh-agent", "/tests/podman_rsh.py"]
    command += ["--yield-when-idle", "on", "--", "python", "/tests/two_nodes.py"]
    tx0, rx0 = link_bytes(first)
    t0 = time.monotonic()
    proc = podman("exec", two_nodes.containers[first], *command, timeout=300)
    took = time.monotonic() - t0
    tx1, rx1 = link_bytes(first)
    sys.stderr.write(
        f"\n[podman] 2 containers x {RANKS_PER_NODE} rank(s): rc={proc.returncode} in {took:.1f} s, "
        f"{first} eth0 tx {(tx1 - tx0) / 2**20:.1f} MiB rx {(rx1 - rx0) / 2**20:.1f} MiB, "
        f"relayed: {[host for host, _ in two_nodes.relay.requests]}\n"
    )
    assert proc.returncode == 0, output(proc)
    for rank in range(np_total):
        node = first if rank < RANKS_PER_NODE else second
        line = f"rank {rank}/{np_total} on {node} (node {rank // RANKS_PER_NODE}/2, uid {IMAGE_UID}): "
        assert line + "allreduce native/ring/hierarchical ok" in proc.stdout, output(proc)
    assert [host for host, _ in two_nodes.relay.requests] == [second], two_nodes.relay.requests
    # Three BIG allreduces (one per algorithm), each at least BIG each way across the link between 2 nodes.
    assert tx1 - tx0 >= 3 * BIG and rx1 - rx0 >= 3 * BIG, (tx1 - tx0, rx1 - rx0)
