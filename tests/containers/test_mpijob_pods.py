"""The MPIJob `hpcring render` writes, run in an EMULATION of the Kubeflow MPI Operator's pods
(mpijob_pods.py): podman containers of the MPIJob image (containers/Dockerfile.mpijob) laid out as the
operator's controller lays out pods: one launcher and two workers on one network with the Service's DNS names,
the hostfile and discover_hosts.sh at /etc/mpi, the SSH Secret at sshAuthMountPath, workers running
`/usr/sbin/sshd -De`. No Kubernetes runs here; the launcher runs exactly the rendered command and environment,
parsed from the YAML.

Proves, for Open MPI 5 and for MPICH (hydra): mpirun reaches both workers over ssh with the operator's files,
ranks land slotsPerWorker to a worker and never on the launcher, the digits example trains across them
(hpcring.torch) and the launcher exits 0. For Open MPI: with a worker missing it fails loudly (non-zero, well
within the timeout); without the rendered `--hostfile` no rank reaches a worker. Opt-in like the other image
tests (HPCRING_TEST_PODMAN=1, root).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from mpijob_pods import OperatorPods, worker_hosts
from podman_images import BUILD_TIMEOUT, ROOT, Containers, build_image, output

pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

IN_IMAGE = Path(__file__).resolve().parent / "in_image"
PROFILE = Path(__file__).resolve().parent / "profiles" / "emulated-k8s.yaml"
WORKERS = 2
RANK_LINE = re.compile(r"^rank (\d+)/(\d+) on (\S+) local (\d+)/(\d+) omp (\S+)$", re.M)
EPOCH = re.compile(r"^epoch\s+(\d+)/\d+\s.*test accuracy ([0-9.]+)\s", re.M)


@dataclass(frozen=True)
class Flavour:
    """One MPI of the MPIJob image: the profile's site.mpi, the image's tag and MPI wheel, the job's shape."""

    mpi: str
    image: str
    wheel: str  # HPCRING_MPIJOB_MPI for ci/build-image.sh build-mpijob ("" = the CPU image's Open MPI)
    slots: int
    epochs: int


OPENMPI = Flavour("openmpi", "localhost/hpcring:mpijob", "", slots=2, epochs=3)
# MPICH's ranks busy-poll while they wait (it has no yield-when-idle): one per worker on CI's 2 cores.
MPICH = Flavour("mpich", "localhost/hpcring:mpijob-mpich", "mpich", slots=1, epochs=1)


@pytest.fixture(scope="module")
def mpijob_images(containers: Containers) -> None:
    """Both MPIJob images, built FROM the session's CPU image (seconds once it exists)."""
    for flavour in (OPENMPI, MPICH):
        t0 = time.monotonic()
        proc = build_image("build-mpijob", timeout=BUILD_TIMEOUT, env={"HPCRING_MPIJOB_MPI": flavour.wheel})
        took = time.monotonic() - t0
        sys.stderr.write(f"\n[podman] build-mpijob {flavour.image}: rc={proc.returncode} in {took:.0f} s\n")
        if proc.returncode != 0:
            pytest.fail(f"build-mpijob {flavour.image} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")


def rendered(flavour: Flavour, work: Path) -> dict[str, Any]:
    """`hpcring render` of the digits job for the emulated profile (with the flavour's site.mpi), loaded back
    from the YAML it prints."""
    prof = work / "emulated-k8s.yaml"
    prof.write_text(PROFILE.read_text().replace("  mpi: openmpi\n", f"  mpi: {flavour.mpi}\n"))
    argv = [sys.executable, "-m", "hpcring", "render", "--profile", str(prof), "--nodes", str(WORKERS)]
    argv += ["--ranks", str(WORKERS * flavour.slots), "--image", flavour.image, "--job-name", "digits", "--"]
    argv += ["python", "/tests/mpijob_train.py", "--epochs", str(flavour.epochs)]
    argv += ["--json-metrics", "/out/metrics.json"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    obj: dict[str, Any] = yaml.safe_load(proc.stdout)
    return obj


@pytest.fixture
def make_pods(
    containers: Containers, mpijob_images: None, tmp_path: Path
) -> Iterator[Callable[[Flavour], OperatorPods]]:
    """Emulated pods of the rendered job for a flavour; removed with their network at the end."""
    made: list[OperatorPods] = []

    def make(flavour: Flavour) -> OperatorPods:
        (tmp_path / "out").mkdir()
        volumes = [f"{IN_IMAGE}:/tests:ro", f"{tmp_path / 'out'}:/out"]
        made.append(OperatorPods(rendered(flavour, tmp_path), flavour.image, tmp_path, containers, volumes))
        return made[-1]

    try:
        yield make
    finally:
        for pods in made:
            pods.close()


@pytest.mark.parametrize("flavour", [OPENMPI, MPICH], ids=lambda f: f.mpi)
def test_rendered_mpijob_trains_across_the_workers(
    make_pods: Callable[[Flavour], OperatorPods], flavour: Flavour, tmp_path: Path
) -> None:
    pods = make_pods(flavour)
    t0 = time.monotonic()
    hosts = pods.start_workers()
    ready = time.monotonic() - t0
    proc = pods.run_launcher(timeout=300)
    took = time.monotonic() - t0
    sys.stderr.write(
        f"\n[podman] emulated MPIJob ({flavour.mpi}): workers ready in {ready:.1f} s, launcher "
        f"rc={proc.returncode} after {took:.1f} s in all\n"
    )
    assert proc.returncode == 0, output(proc)
    found = RANK_LINE.findall(proc.stdout)
    assert {omp for *_, omp in found} == {"1"}, output(proc)  # the image's ENV, through sshd's SetEnv
    ranks = {int(r): (host, int(local), int(size)) for r, _, host, local, size, _ in found}
    n, slots = WORKERS * flavour.slots, flavour.slots
    assert sorted(ranks) == list(range(n)), output(proc)
    for rank, (host, local, local_size) in ranks.items():
        # slots per worker, in the hostfile's order: ranks fill worker 0, then worker 1.
        assert host == hosts[rank // slots] and local == rank % slots and local_size == slots, (rank, ranks)
    assert {host for host, _, _ in ranks.values()} == set(worker_hosts(pods.obj)), ranks
    epochs = [(int(e), float(a)) for e, a in EPOCH.findall(proc.stdout)]
    assert [e for e, _ in epochs] == list(range(1, flavour.epochs + 1)), output(proc)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["size"] == n and metrics["epochs"] == flavour.epochs, metrics
    assert metrics["test_accuracy"] > 0.5, metrics  # chance is 0.1; 0.64 after one epoch, 0.84 after three


def test_missing_worker_fails_loudly(make_pods: Callable[[Flavour], OperatorPods]) -> None:
    """Worker 1 never starts (its DNS record does not exist, as when its pod is gone): the launcher must fail
    with a non-zero status, not hang and not train on fewer pods."""
    pods = make_pods(OPENMPI)
    pods.start_workers(count=WORKERS - 1)
    t0 = time.monotonic()
    proc = pods.run_launcher(timeout=120)
    took = time.monotonic() - t0
    sys.stderr.write(
        f"\n[podman] emulated MPIJob, 1 of {WORKERS} workers: rc={proc.returncode} in {took:.1f} s\n"
    )
    assert proc.returncode not in (0, 124, 137), output(proc)
    assert took < 90, took
    assert not RANK_LINE.search(proc.stdout), output(proc)
    missing = worker_hosts(pods.obj)[-1]
    assert f"{missing}.digits.default.svc" in proc.stderr, output(proc)  # ssh names the unresolvable pod


def test_operator_variable_alone_keeps_ranks_off_the_workers(
    make_pods: Callable[[Flavour], OperatorPods],
) -> None:
    """Why mpirun names the hostfile: without `--hostfile`, Open MPI 5 has only the operator's
    OMPI_MCA_orte_default_hostfile, which PRRTE ignores (kubeflow/mpi-operator issue 842), so no rank reaches
    a worker: they all run in the launcher pod (oversubscribed, as the image allows) or mpirun refuses."""
    pods = make_pods(OPENMPI)
    (launcher,) = pods.obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    command = list(launcher["command"])
    at = command.index("--hostfile")
    assert command[at + 1] == "/etc/mpi/hostfile"
    launcher["command"] = command[:at] + command[at + 2 :]
    launcher["command"][launcher["command"].index("--epochs") + 1] = "1"
    pods.start_workers()
    proc = pods.run_launcher(timeout=300)
    hosts = {host for _, _, host, *_ in RANK_LINE.findall(proc.stdout)}
    sys.stderr.write(
        f"\n[podman] emulated MPIJob without --hostfile: rc={proc.returncode}, ranks on {hosts}\n"
    )
    if proc.returncode == 0:
        assert hosts == {"digits-launcher"}, output(proc)
    else:
        assert not hosts & set(worker_hosts(pods.obj)), output(proc)
