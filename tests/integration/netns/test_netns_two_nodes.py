"""Two fake nodes (network namespaces joined by veth + bridge), two ranks each, launched by `hpcring run -H`.

mpiexec runs on the first node (ci/on-node), remote daemons start through ci/netns-rsh (our ssh stand-in,
given with --rsh-agent), so the launcher, the MPI wire-up and the collectives all run over real TCP between
two IP stacks with distinct hostnames. Inside the ranks, tests/ranked/netns/test_two_nodes.py checks the
topology, exact allreduce results for native/ring/hierarchical, and per-algorithm link bytes against theory.
Here we also read the node's eth0 counters from outside as an independent check that the traffic crossed it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from netns_cluster import ON_NODE, ROOT, RSH, NetnsCluster, flavour_python

RANKED = "tests/ranked/netns/test_two_nodes.py"
BIG = 8 << 20  # must match the ranked test: one BIG allreduce (plus a warm-up) per algorithm
LOCAL = 2  # ranks per node


def launch(cluster: NetnsCluster, flavour: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """`hpcring run` on the first node, one LOCAL-rank slot list per node, ranks running the ranked tests."""
    py = flavour_python(flavour)
    if py is None:
        pytest.skip(f"no {flavour} environment (run `make setup`)")
    hosts = ",".join(f"{n}:{LOCAL}" for n in cluster.nodes)
    argv = [
        str(ON_NODE),
        cluster.nodes[0],
        py,
        "-m",
        "hpcring",
        "run",
        "-np",
        str(LOCAL * len(cluster.nodes)),
    ]
    # The fake nodes share this machine's cores, which Open MPI cannot see: ask it to yield when idle.
    argv += ["--mpi", flavour, "-H", hosts, "--rsh-agent", str(RSH), "--yield-when-idle", "on", "--"]
    argv += [py, "-m", "pytest", "-q", "-x", "-s", "-p", "no:cacheprovider", RANKED]
    env = {
        **os.environ,
        "HPCRING_RANKED": "1",
        "PYTHONUNBUFFERED": "1",
        "HPCRING_TEST_NODES": ",".join(cluster.nodes),
    }
    if flavour == "mpich":
        # OFI's tcp provider on the node's veth, not UCX: UCX cards overrun MPICH's PMI lines at random
        # (tests/integration/slurm/profiles/emulated-srun.yaml says how), and would use shared memory
        # across namespaces (one kernel).
        env.update(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="eth0")
    return subprocess.run(
        ["timeout", "-k", "5", str(timeout), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.parametrize("flavour", ["openmpi", "mpich"])
def test_two_nodes_two_ranks_each(netns_cluster: NetnsCluster, flavour: str) -> None:
    first = netns_cluster.nodes[0]
    tx0, rx0 = netns_cluster.counters(first)
    t0 = time.monotonic()
    proc = launch(netns_cluster, flavour)
    took = time.monotonic() - t0
    tx1, rx1 = netns_cluster.counters(first)
    sys.stderr.write(
        f"\n[netns] {flavour} 2x{LOCAL} ranks: rc={proc.returncode} in {took:.1f} s, {first} eth0 "
        f"tx {(tx1 - tx0) / 2**20:.1f} MiB rx {(rx1 - rx0) / 2**20:.1f} MiB\n"
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert "passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout
    # Two BIG allreduces (warm-up + measured) per algorithm, each at least BIG per direction on 2 nodes.
    expected = 3 * 2 * BIG
    assert tx1 - tx0 >= expected and rx1 - rx0 >= expected, (tx1 - tx0, rx1 - rx0, expected)
