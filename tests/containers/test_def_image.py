"""singularity/hpcring.def built for real: ci/def2oci.py turns it into a podman build FROM the CPU image
(`ci/build-image.sh build-def`, once per session in conftest.py), laid out as apptainer lays out a .sif, so:

    podman run IMG ARGS                                          = apptainer run hpcring.sif ARGS
    podman run --entrypoint /.singularity.d/actions/exec IMG CMD = apptainer exec hpcring.sif CMD
    podman run --entrypoint /.singularity.d/actions/test IMG     = apptainer test hpcring.sif

Opt-in like the other image tests (HPCRING_TEST_PODMAN=1, root).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from podman_images import BUILD_TIMEOUT, DEF_IMAGE, IMAGE_UID, ROOT, Containers, output, run_rendered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

EXEC = ["--entrypoint", "/.singularity.d/actions/exec"]
TEST = ["--entrypoint", "/.singularity.d/actions/test"]


def section(name: str) -> str:
    """A section's body from the .def, indentation kept (apptainer stores %help as written)."""
    text = (ROOT / "singularity" / "hpcring.def").read_text()
    return text.split(f"\n%{name}\n", 1)[1].split("\n%", 1)[0].rstrip("\n") + "\n"


def test_def_test_section_passes(containers: Containers) -> None:
    """`apptainer test`: the 1-rank collective self-test of %test, as the image's non-root user."""
    proc = containers.run(DEF_IMAGE, options=TEST, timeout=180)
    assert proc.returncode == 0, output(proc)
    assert "hpcring self-test ok: 1 rank(s), torch 2.13.0" in proc.stdout, output(proc)


def test_def_runscript_runs_hpcring_with_the_arguments(containers: Containers) -> None:
    """`apptainer run hpcring.sif run -np 2 -- python -c ...`: the runscript is `hpcring ARGS`."""
    code = (
        "import numpy as np, hpcring; hpcring.init(); r, n = hpcring.rank(), hpcring.size(); "
        "x = hpcring.allreduce(np.full(8, r + 1.0)); assert (x == n * (n + 1) / 2).all(), x; "
        "print(f'runscript rank {r}/{n} allreduce ok', flush=True)"
    )
    proc = containers.run(DEF_IMAGE, ["run", "-np", "2", "--", "python", "-c", code], timeout=180)
    assert proc.returncode == 0, output(proc)
    for rank in (0, 1):
        assert f"runscript rank {rank}/2 allreduce ok" in proc.stdout, output(proc)


def test_def_environment_and_help(containers: Containers) -> None:
    """The exec action sources %environment: its defaults apply, a value the job set wins; the bind-model
    mount point for host libraries exists; %help is where `apptainer run-help` reads it."""
    probe = 'echo "threads=$OMP_NUM_THREADS yield=$OMPI_MCA_mpi_yield_when_idle mpi=$HPCRING_IMAGE_MPI '
    probe += 'uid=$(id -u) host-libs=$(test -d /opt/hpcring/host-libs && echo yes)"; '
    probe += "command -v hpcring; cat /.singularity.d/runscript.help"
    proc = containers.run(DEF_IMAGE, ["sh", "-c", probe], options=EXEC, timeout=60)
    assert proc.returncode == 0, output(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"threads=1 yield=1 mpi=openmpi uid={IMAGE_UID} host-libs=yes", output(proc)
    assert lines[1] == "/opt/venv/bin/hpcring", output(proc)
    assert proc.stdout.split("\n", 2)[2] == section("help"), output(proc)
    job = containers.run(
        DEF_IMAGE, ["sh", "-c", "echo $OMP_NUM_THREADS"], options=[*EXEC, "-e", "OMP_NUM_THREADS=3"]
    )
    assert job.stdout.strip() == "3", output(job)


def test_rendered_command_runs_in_the_def_image(containers: Containers, tmp_path: Path) -> None:
    """The rank line of `hpcring render --image` through the exec action, as `apptainer exec` would run it."""
    metrics, _ = run_rendered(containers, tmp_path, DEF_IMAGE, entrypoint=EXEC)
    assert metrics["size"] == 1 and metrics["epochs"] == 2, metrics
