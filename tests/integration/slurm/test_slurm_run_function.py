"""`hpcring.run` inside a 2-node Slurm allocation, given no hosts: its ranks land on both nodes.

The batch script calls tests/launch/run_function_driver.py (`hpcring.run(where, num_proc=4)`) once in a
`--nodes 2 --ntasks-per-node 2` job: hpcring.run reads the allocation's hosts (hpcring.launch.allocation) and
Open MPI's mpiexec starts two ranks on each node through Slurm.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    NODES,
    OMPI_PY,
    ROOT,
    Cluster,
    sbatch,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration
DRIVER = ROOT / "tests" / "launch" / "run_function_driver.py"
PER_NODE = 2


def test_hpcring_run_uses_the_allocations_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    np = NODES * PER_NODE
    script = tmp_path / "run.sh"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f"cd {tmp_path}\n"
        f"PYTHONPATH={ROOT} timeout -k 5 150 {OMPI_PY} {DRIVER} where {np}\n"
        f'test -z "$(ls -A {tmp_path} | grep hpcring-run)"\n'  # the call's folder is gone
    )
    args = ("--nodes", str(NODES), "--ntasks-per-node", str(PER_NODE))
    job = sbatch(script, tmp_path / "run.out", args=args, timeout=180)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job.output
    line = next(x for x in job.output.splitlines() if x.startswith("RESULT "))
    ranks = json.loads(line.removeprefix("RESULT "))["ok"]
    assert [(r["rank"], r["size"]) for r in ranks] == [(r, np) for r in range(np)], job.output
    nodes = [r["node"] for r in ranks]
    assert sorted(set(nodes)) == [f"node{i + 1}" for i in range(NODES)], nodes
    assert all(nodes.count(n) == PER_NODE for n in set(nodes)), nodes
    hosts = ",".join(f"node{i + 1}:{PER_NODE}" for i in range(NODES))
    assert f"--host {hosts}" in job.output  # verbose: the allocation's hosts reached mpiexec
