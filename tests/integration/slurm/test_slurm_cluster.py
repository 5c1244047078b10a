"""The emulated cluster itself: the script is idempotent, nodes are distinct Slurm nodes, and binding is real.

These need nothing from hpcring; they pin down the facts the other Slurm tests rely on (node identity via
SLURM_NODEID/SLURMD_NODENAME since every node shares this host's name, and CPU binding by task/affinity).
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    Cluster,
    cluster_sh,
    scontrol_node,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration


def test_up_is_idempotent_and_status_answers(slurm_cluster: Cluster) -> None:
    t0 = time.monotonic()
    again = cluster_sh("up", timeout=120)
    assert again.returncode == 0, again.stderr
    assert "(re)starting" not in again.stderr, "an unchanged config must not restart the daemons"
    assert time.monotonic() - t0 < 60  # a hang guard, not a timing claim: it normally takes well under 1 s
    status = cluster_sh("status", timeout=60)
    assert status.returncode == 0, status.stderr
    for n in range(1, slurm_cluster.nodes + 1):
        assert f"node{n}" in status.stdout
        assert scontrol_node(f"node{n}")["State"].startswith(("IDLE", "MIXED", "ALLOCATED"))


def test_nodes_are_distinct_and_tasks_are_bound(slurm_cluster: Cluster) -> None:
    """srun places tasks node by node, and task/affinity pins each to its own core of that node."""
    per_node = slurm_cluster.cpus_per_node
    probe = (
        'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURMD_NODENAME $(hostname) '
        '$(grep Cpus_allowed_list /proc/self/status | cut -f2)"'
    )
    nodes = slurm_cluster.nodes
    srun = ["timeout", "60", "srun", "-N", str(nodes), f"--ntasks-per-node={per_node}", "--cpu-bind=cores"]
    res = subprocess.run([*srun, "bash", "-c", probe], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    rows = sorted(line.split() for line in res.stdout.splitlines())
    assert len(rows) == nodes * per_node
    for proc, local, node, nodename, host, cpus in rows:
        rank = int(proc)
        assert int(node) == rank // per_node and int(local) == rank % per_node
        assert nodename == f"node{int(node) + 1}"
        assert host == socket.gethostname()  # every emulated node is this host
        assert cpus == str(int(local)), f"rank {rank}: bound to {cpus}, expected core {local}"
