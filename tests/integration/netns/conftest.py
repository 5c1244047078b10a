"""A fake 2-node cluster of network namespaces (ci/netns-cluster.sh), up for the module, always torn down.

Needs root and `ip netns` + `unshare --uts` (iproute2, util-linux); otherwise the tests are skipped with the
reason. HPCRING_TEST_NETNS=0 skips them on purpose.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
from netns_cluster import PREFIX, NetnsCluster, cluster_sh, reap_stale, skip_reason


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[NetnsCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    reap_stale()
    try:
        up = cluster_sh("up", "2")
        if up.returncode != 0:
            pytest.fail(f"ci/netns-cluster.sh up 2 failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        sys.stderr.write(f"\n[netns] 2 nodes up in {time.monotonic() - t0:.2f} s\n")
        yield NetnsCluster(nodes=(f"{PREFIX}1", f"{PREFIX}2"))
    finally:
        down = cluster_sh("down", "2")
        sys.stderr.write(f"\n[netns] down rc={down.returncode} {down.stderr.strip()}\n")
