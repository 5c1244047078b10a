"""Two fake nodes (network namespaces joined by veth + bridge), two ranks each, launched by `hpcring run -H`.

The launches are declared in tests/ranked/launches.py (`openmpi-2x2-netns`, `mpich-2x2-netns`): mpiexec
runs on the first node (ci/on-node), remote daemons start through ci/netns-rsh (our ssh stand-in, given with
--rsh-agent), so the launcher, the MPI wire-up and the collectives all run over real TCP between two IP
stacks with distinct hostnames (`RankedSite` in netns_cluster.py brings the nodes up and places the ranks).
Inside the ranks, tests/ranked/netns/test_two_nodes.py checks the topology, exact allreduce results for
native/ring/hierarchical, and per-algorithm link bytes against theory, each reported as its own test. Here
we also read the first node's eth0 counters from outside as an independent check that the traffic crossed it.
"""

from __future__ import annotations

import pytest
from ranked_records import LaunchResult
from ranked_spec import uses_launches

BIG = 8 << 20  # must match the ranked test: one BIG allreduce (plus a warm-up) per algorithm


@pytest.mark.integration
@uses_launches("netns/openmpi-2x2-netns", "netns/mpich-2x2-netns")
def test_traffic_crossed_the_first_nodes_link(ranked_launch: LaunchResult) -> None:
    tx, rx = ranked_launch.extras["link_bytes"]
    # Two BIG allreduces (warm-up + measured) per algorithm, each at least BIG per direction on 2 nodes.
    expected = 3 * 2 * BIG
    assert tx >= expected and rx >= expected, (tx, rx, expected, f"launch output: {ranked_launch.log_file}")
