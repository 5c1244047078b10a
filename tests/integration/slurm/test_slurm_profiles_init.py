"""`hpcring profiles init` inside a job of the real Slurm CI cluster (ci/slurm-cluster.sh): the profile it
writes on the compute node names the cluster (ClusterName=hpcring-ci), has this host's cores, finds Slurm with
its `debug` partition (Default=YES, MaxTime=INFINITE: left as a TODO), validates, and round-trips through
`hpcring map` and `hpcring render`; the rendered script then runs under sbatch on both nodes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    NODES,
    OMPI_PY,
    Cluster,
    hpcring_cli,
    sbatch,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration


def test_profiles_init_in_a_slurm_job(slurm_cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "ci.yaml"
    script = tmp_path / "init.sh"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        f"{OMPI_PY} -m hpcring profiles init -o {out}\n"
        'echo "node=$SLURMD_NODENAME"\n'
    )
    job = sbatch(script, tmp_path / "init.out", args=("--nodes", "1", "--ntasks", "1"))
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job.output
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "hpcring-ci"  # Slurm's ClusterName, read by scontrol inside the job
    node, site = data["node"], data["site"]
    assert node["sockets"] * node["cores_per_socket"] * node["threads_per_core"] == os.cpu_count()
    assert (site["scheduler"], site["launcher"]) == ("slurm", "srun")
    assert "# TODO - {name: debug, max_walltime: ...}" in out.read_text()  # MaxTime=INFINITE
    assert hpcring_cli("profiles", "validate", str(out)).returncode == 0
    mapped = hpcring_cli("map", "--profile", str(out), "--nodes", str(NODES), "--format", "json")
    assert mapped.returncode == 0, mapped.stderr
    records = json.loads(mapped.stdout)
    assert [r["node"] for r in records] == sorted(r["node"] for r in records) and records[-1][
        "node"
    ] == NODES - 1
    job_sh = tmp_path / "job.sh"
    rendered = hpcring_cli(
        "render", "--profile", str(out), "--nodes", str(NODES), "-o", str(job_sh), "--", "hostname"
    )
    assert rendered.returncode == 0, rendered.stderr
    run = sbatch(job_sh, tmp_path / "job.out")
    assert (run.state, run.exit_code) == ("COMPLETED", 0), run.output
