"""Golden job scripts for the site profiles added with schema v2 (LUMI-G, LUMI-C, Alps GH200 on Slurm;
Polaris and Aurora on PBS; Tuolumne and El Capitan on Flux), with and without a container where the site
documents a runtime, each shellcheck-clean.

Regenerate after an intended change with
`HPCRING_UPDATE_GOLDEN=1 pytest tests/schedulers/test_render_sites.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sched_helpers import check_golden, check_shellcheck, make_plan, render_plan

from hpcring.errors import ConfigError

TRAIN = ("python", "train.py", "--epochs", "3")

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lumi-g-slurm": ("lumi-g", {"nodes": 4, "account": "project_465000000", "command": TRAIN}),
    "lumi-g-container": (
        "lumi-g",
        {
            "nodes": 2,
            "account": "project_465000000",
            "image": "/scratch/project_465000000/train.sif",
            "binds": ("/scratch/project_465000000",),
            "command": TRAIN,
        },
    ),
    "lumi-c-slurm": (
        "lumi-c",
        {
            "nodes": 2,
            "ranks_per_node": 16,
            "cpus_per_rank": 8,
            "account": "project_465000000",
            "command": TRAIN,
        },
    ),
    "lumi-c-container": (
        "lumi-c",
        {"nodes": 1, "account": "project_465000000", "image": "/scratch/img/cpu.sif", "command": TRAIN},
    ),
    "alps-gh200-slurm": ("alps-gh200", {"nodes": 2, "account": "g123", "command": TRAIN}),
    "alps-gh200-container": (
        "alps-gh200",
        {
            "nodes": 2,
            "account": "g123",
            "image": "nvcr.io#nvidia/pytorch:25.11-py3",
            "binds": ("/capstor/scratch/cscs/user",),
            "command": TRAIN,
        },
    ),
    "polaris-pbs": ("polaris", {"nodes": 2, "account": "MyProject", "command": TRAIN}),
    "polaris-container": (
        "polaris",
        {
            "nodes": 2,
            "account": "MyProject",
            "image": "/eagle/MyProject/train.sif",
            "binds": ("/eagle/MyProject",),
            "command": TRAIN,
        },
    ),
    "aurora-pbs": ("aurora", {"nodes": 2, "account": "MyProject", "command": TRAIN}),
    "aurora-container": (
        "aurora",
        {
            "nodes": 2,
            "account": "MyProject",
            "image": "/flare/MyProject/train.sif",
            "binds": ("/flare/MyProject",),
            "command": TRAIN,
        },
    ),
    "tuolumne-flux": ("tuolumne", {"nodes": 2, "command": TRAIN}),
    "el-capitan-flux": ("el-capitan", {"nodes": 2, "command": TRAIN}),
}


def _render(variant: str) -> str:
    name, job = VARIANTS[variant]
    return render_plan(make_plan(name, **dict(job)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden(variant: str) -> None:
    check_golden(variant, _render(variant))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shellcheck_clean(variant: str, tmp_path: Path) -> None:
    check_shellcheck(tmp_path, _render(variant))


def test_lumi_g_binding_is_the_documented_one() -> None:
    """The srun line carries LUMI's documented mask_cpu list (distribution-binding, "GPU Binding")."""
    text = _render("lumi-g-slurm")
    masks = "0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000"
    assert f"--cpu-bind=mask_cpu:{masks}" in text
    ctr = _render("lumi-g-container")
    # LUMI's PyTorch page: /appl bound, the aws-ofi-rccl plugin's directory first in the image's library path.
    assert "singularity exec --rocm --bind /appl" in ctr and "--bind /scratch/project_465000000 " in ctr
    assert '--env LD_LIBRARY_PATH="${EBROOTAWSMINOFIMINRCCL}"/lib:' in ctr


def test_aurora_ranks_see_their_tile() -> None:
    """Each local rank's ZE_AFFINITY_MASK is its tile as a FLAT device (tile 0.1 is device 1, 5.1 is 11),
    and mpiexec binds the documented core list."""
    text = _render("aurora-pbs")
    assert "  1) devices=1 ;;" in text and "  11) devices=11 ;;" in text
    assert "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100" in text


def test_alps_container_engine_instead_of_a_runtime() -> None:
    """CSCS documents its own Container Engine, not Apptainer: an image becomes an EDF and `srun
    --environment`, with no runtime wrapped around the rank command (tests/schedulers/test_site_alps.py has
    the documented examples)."""
    text = _render("alps-gh200-container")
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    assert srun.startswith('srun --environment="$HPCRING_EDF" --mpi=pmi2 ') and srun.endswith(" ".join(TRAIN))
    assert "apptainer" not in text and "singularity" not in text


# ALCF's documented chunk, in its order (https://docs.alcf.anl.gov/running-jobs/ and its example job scripts;
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ "Recommended PBSPro options"): whole nodes by the
# `system` resource, no ncpus/ngpus, place=scatter, walltime, the mandatory file systems, queue, project.
ALCF_DIRECTIVES = {
    "polaris": [
        "-l select=2:system=polaris",
        "-l place=scatter",
        "-l walltime=01:00:00",
        "-l filesystems=home:eagle",
        "-q debug",
        "-A MyProject",
    ],
    "aurora": [
        "-l select=2:system=aurora",
        "-l place=scatter",
        "-l walltime=01:00:00",
        "-l filesystems=home:flare",
        "-q debug",
        "-A MyProject",
        "-k doe",
    ],
}


@pytest.mark.parametrize("site", sorted(ALCF_DIRECTIVES))
def test_alcf_job_directives_are_the_documented_ones(site: str) -> None:
    lines = [ln[len("#PBS ") :] for ln in _render(f"{site}-pbs").splitlines() if ln.startswith("#PBS ")]
    # -N (the job's name) and -j oe (one output file, the default without --error) are hpcring's own.
    assert [ln for ln in lines if not ln.startswith(("-N ", "-j "))] == ALCF_DIRECTIVES[site]
    assert not any("ncpus" in ln or "ngpus" in ln for ln in lines)


@pytest.mark.parametrize("site", ["tuolumne", "el-capitan"])
def test_llnl_sites_refuse_an_image_saying_why(site: str) -> None:
    """The container-on column of the El Capitan systems: no runtime is configured (LLNL's container set-up
    for them could not be cited), so an image is refused up front, naming the profile and the reason, instead
    of rendering a script that cannot run it."""
    with pytest.raises(ConfigError) as info:
        make_plan(site, nodes=1, account="a", image="/img/train.sif", command=TRAIN)
    msg = str(info.value)
    assert f"profile '{site}' has no container runtime: LLNL's documentation" in msg
    assert "set site.container.runtime to" in msg


def _lines(variant: str) -> list[str]:
    return _render(variant).splitlines()


def test_polaris_container_is_alcfs_documented_setup() -> None:
    """ALCF's Polaris container page: `ml use /soft/modulefiles; ml spack-pe-base; ml apptainer`,
    cray-mpich-abi, `apptainer exec --fakeroot -B /opt -B /var/run/palsd/` with Cray MPICH's and PALS's
    libraries on the container's LD_LIBRARY_PATH, and the job asking for fakeroot
    (-l singularity_fakeroot=true)."""
    lines = _lines("polaris-container")
    modules = [ln for ln in lines if ln.startswith("module ")]
    assert modules == [
        "module use /soft/modulefiles",
        "module load spack-pe-base",
        "module load apptainer",
        "module load cray-mpich-abi",
    ]
    assert "#PBS -l singularity_fakeroot=true" in lines
    (launch,) = [ln for ln in lines if ln.startswith("mpiexec ")]
    runtime = launch[launch.index("apptainer exec") :]
    assert runtime.startswith("apptainer exec --nv --bind /opt/cray --bind /var/run/palsd ")
    assert (
        '--env LD_LIBRARY_PATH="${CRAY_LD_LIBRARY_PATH}":"${LD_LIBRARY_PATH}":/opt/cray/pe/pals/1.2.12/lib:'
        "/.singularity.d/libs:'$LD_LIBRARY_PATH' --env MPI4PY_LIBMPI=libmpi.so.12" in runtime
    )
    assert runtime.endswith("--fakeroot /eagle/MyProject/train.sif python train.py --epochs 3")
    # The GPU wrapper runs on the host, so CUDA_VISIBLE_DEVICES reaches the container (Apptainer passes the
    # host environment); the container goes after it.
    assert launch.index('bash "$HPCRING_AFFINITY"') < launch.index("apptainer exec")


def test_aurora_container_is_alcfs_documented_setup() -> None:
    """ALCF's Aurora container page: `module load apptainer`, --fakeroot, and its MPI example's PMIx
    library bound to /hostlib with the host's /usr/lib64 at /hostevent first on the library path."""
    lines = _lines("aurora-container")
    assert [ln for ln in lines if ln.startswith("module ")] == ["module load apptainer"]
    assert "#PBS -l singularity_fakeroot=true" in lines
    (launch,) = [ln for ln in lines if ln.startswith("mpiexec ")]
    runtime = launch[launch.index("apptainer exec") :]
    assert runtime == (
        "apptainer exec --bind /usr/lib64/libpmix.so.2:/hostlib/libpmix.so.2 --bind /usr/lib64:/hostevent "
        "--env LD_LIBRARY_PATH=/hostevent:/.singularity.d/libs:'$LD_LIBRARY_PATH' --bind /flare/MyProject "
        "--env I_MPI_PMI_LIBRARY=/hostlib/libpmix.so.2 --fakeroot /flare/MyProject/train.sif "
        "python train.py --epochs 3"
    )


@pytest.mark.parametrize("site", ["polaris", "aurora"])
def test_container_only_settings_stay_out_of_host_jobs(site: str) -> None:
    """Without --image the script is the host one: no fakeroot request, no runtime modules."""
    text = _render(f"{site}-pbs")
    assert "singularity_fakeroot" not in text
    assert "apptainer" not in text and "module use" not in text
