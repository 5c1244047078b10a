"""A real Slurm cluster for the integration tests: brought up once per session, always torn down.

The tests run only where that is allowed and wanted (root and HPCRING_TEST_SLURM=1, see
slurm_jobs.skip_reason); otherwise each test is skipped with the reason.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
from slurm_jobs import NODES, Cluster, cluster_sh, scontrol_node, skip_reason


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """Bring the cluster up for the session and tear it down at the end, even when a test or `up` failed."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    try:
        up = cluster_sh("up", timeout=600)  # a cold apt install takes ~10 s; the limit only guards a hang
        if up.returncode != 0:
            pytest.fail(f"ci/slurm-cluster.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        up_s = time.monotonic() - t0
        cpus = int(scontrol_node("node1")["CPUTot"])
        sys.stderr.write(f"\n[slurm] cluster up in {up_s:.1f} s ({NODES} nodes x {cpus} CPUs)\n")
        yield Cluster(nodes=NODES, cpus_per_node=cpus, up_seconds=up_s)
    finally:
        down = cluster_sh("down", timeout=120)
        sys.stderr.write(f"\n[slurm] down rc={down.returncode}; session took {time.monotonic() - t0:.1f} s\n")
