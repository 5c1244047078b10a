"""examples/train_digits.py trained inside a 2-node Slurm job reaches the same accuracy as locally.

The same command, seed and world size (2 nodes x 2 ranks) run twice: once on this machine under `hpcring run
-np 4 --emulate-nodes 2` (so hpcring sees the same 2-node topology and picks the same algorithms), once in a
job rendered by `hpcring render` for the emulated cluster (Open MPI, the venv with torch) and submitted with
sbatch. Each writes rank 0's final metrics as JSON. Both must reach the example's target (>= 95 % test
accuracy) and agree to within one test sample: data sharding, initial weights (broadcast from rank 0) and
gradient averaging are the same, so only the order of floating-point sums may differ.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    NODES,
    OMPI_PY,
    PROFILES,
    ROOT,
    Cluster,
    finish,
    hpcring_cli,
    job_env,
    slurm_cluster_fixture,
    submit,
)

pytestmark = pytest.mark.integration

RANKS_PER_NODE = 2
EPOCHS = 12  # the example's default, which reaches >= 95 %
TEST_SAMPLES = 360  # 20 % of the 1797 digits: one sample is 1/360 of accuracy
EXAMPLE = ROOT / "examples" / "train_digits.py"


def train_cmd(metrics: Path) -> list[str]:
    return [
        str(OMPI_PY),
        str(EXAMPLE),
        "--epochs",
        str(EPOCHS),
        "--seed",
        "42",
        "--json-metrics",
        str(metrics),
    ]


def train_locally(work: Path) -> dict[str, float]:
    metrics = work / "local.json"
    launch = [str(OMPI_PY), "-m", "hpcring", "run", "-np", str(NODES * RANKS_PER_NODE)]
    launch += ["--emulate-nodes", str(NODES), "--", *train_cmd(metrics)]
    env = {**job_env(), "HPCRING_RANKED": "0"}
    res = subprocess.run(
        ["timeout", "-k", "5", "300", *launch], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    assert res.returncode == 0, f"local training failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    data: dict[str, float] = json.loads(metrics.read_text())
    return data


def render_training(work: Path) -> Path:
    script = work / "train.sh"
    shape = ["--profile", str(PROFILES / "emulated-mpirun.yaml"), "--nodes", str(NODES)]
    shape += ["--ranks-per-node", str(RANKS_PER_NODE), "--job-name", "hpcring-train-digits"]
    res = hpcring_cli("render", *shape, "-o", str(script), "--", *train_cmd(work / "slurm.json"))
    assert res.returncode == 0, res.stderr
    return script


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/train_digits.py is not in this checkout")
def test_digits_in_slurm_matches_local(slurm_cluster: Cluster, tmp_path: Path) -> None:
    # The Slurm job and the local run go side by side: torch start-up dominates both, and CI time is precious.
    pending = submit(render_training(tmp_path), tmp_path / "train.out")
    local = train_locally(tmp_path)
    job = finish(pending, timeout=300)
    assert job.exit_code == 0, f"job {job.job_id} ({job.state}, exit {job.exit_code}):\n{job.output}"
    # Rank 0 prints one line per epoch: the job really trained, in Slurm, for every epoch.
    assert sum("test accuracy" in line for line in job.output.splitlines()) == EPOCHS, job.output
    slurm: dict[str, float] = json.loads((tmp_path / "slurm.json").read_text())
    assert local["size"] == slurm["size"] == NODES * RANKS_PER_NODE
    assert local["test_accuracy"] >= 0.95, local
    assert slurm["test_accuracy"] >= 0.95, slurm
    diff = abs(local["test_accuracy"] - slurm["test_accuracy"])
    assert diff <= 1 / TEST_SAMPLES + 1e-9, f"local {local} vs slurm {slurm}"
    print(f"local: {local}\nslurm: {slurm}")  # shown with -s or -rP: the figures behind docs/dev/slurm-ci.md
