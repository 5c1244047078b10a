"""A rendered elastic job (`elastic: {min_nodes: 1}`) loses a node's ranks and completes on the node left.

The job spans the emulated cluster's nodes with one task each; in the first attempt the task on the last node
is SIGKILLed (as a dying node takes its ranks). `#SBATCH --no-kill` keeps the allocation, the runner names
the lost node in the job's log and runs the step again on the other node(s), which then succeed. The elastic
training state itself (commits in node-local memory, restore at a new size) is tested under the local
launcher in tests/elastic; this test checks the allocation side of it on a real Slurm.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    HERE,
    MPICH_PY,
    NODES,
    PROFILES,
    Cluster,
    hpcring_cli,
    sbatch,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration


def test_an_elastic_job_goes_on_without_the_node_it_lost(slurm_cluster: Cluster, tmp_path: Path) -> None:
    lost = f"node{NODES}"
    job = {
        "nodes": NODES,
        "ranks_per_node": 1,
        "elastic": {"min_nodes": NODES - 1, "max_restarts": 1},
        "command": [str(MPICH_PY), str(HERE / "elastic_step.py"), str(tmp_path), lost],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    script = tmp_path / "job.sh"
    prof = str(PROFILES / "emulated-srun.yaml")
    res = hpcring_cli("render", "--profile", prof, "--job", str(tmp_path / "job.yaml"), "-o", str(script))
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --no-kill" in script.read_text()
    done = sbatch(script, tmp_path / "job.out", timeout=240)
    ctx = f"job {done.job_id} ({done.state}, exit {done.exit_code}, {done.seconds:.1f} s):\n{done.output}"
    assert done.exit_code == 0 and done.state == "COMPLETED", ctx
    assert f"hpcring elastic: lost node {lost}" in done.output, ctx
    left = ",".join(f"node{i}" for i in range(1, NODES))
    assert f"relaunching the step on {left} from the last commit (restart 1)" in done.output, ctx
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report-*.json"))]
    assert len(reports) == NODES - 1, ctx
    for r in reports:
        assert r["generation"] == 1 and r["node"] != lost and r["nodes"] == NODES - 1, r
        assert r["elastic"] == "1" and r["directory"] == f"/dev/shm/hpcring-elastic-{done.job_id}", r
