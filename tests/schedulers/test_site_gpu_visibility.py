"""GPU visibility per site, as each site documents it: the rendered job reproduces the site's own example
(directives, launch line, the per-rank wrapper's variables), and the wrapper run with the launcher's local
rank variable exports what the site's script exports.

Pages (read 2026-11-27, cited in the profiles too):
- LUMI-G: https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/lumig-job/ ("MPI-based job") and
  https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/ ("GPU Binding").
- Aurora: https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ ("Binding MPI ranks to GPUs": the
  gpu_tile_compact.sh listing, and the `frameworks` module's ZE_FLAT_DEVICE_HIERARCHY=FLAT with a per-device
  ZE_AFFINITY_MASK) and https://docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch/ (FLAT "is the
  recommended setting for AI/ML workloads").
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from sched_helpers import check_shellcheck, cli, make_plan, render_plan

from hpcring.schedulers import cpuset

# lumig-job, "MPI-based job" (verbatim): the batch lines, the CPU binding and the select_gpu body.
LUMI_SBATCH = ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=standard-g")
LUMI_MAP_CPU = "map_cpu:49,57,17,25,1,9,33,41"
LUMI_SELECT_GPU = "export ROCR_VISIBLE_DEVICES=$SLURM_LOCALID"


def _as_written(text: str, sep: str) -> list[str]:
    """A list exactly as the documentation writes it, split into its per-rank entries."""
    return text.split(sep)


def _srun_words(text: str) -> list[str]:
    return shlex.split(next(ln for ln in text.splitlines() if ln.startswith("srun ")))


def _run_wrapper(
    tmp_path: Path, content: str, env: dict[str, str], probe: str
) -> subprocess.CompletedProcess[str]:
    wrapper = tmp_path / "affinity.sh"
    wrapper.write_text(content)
    return subprocess.run(
        ["bash", str(wrapper), "sh", "-c", probe],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=30,
    )


def test_lumi_g_job_as_lumig_job_page(tmp_path: Path) -> None:
    """2 nodes x 8 ranks, one GCD a rank: `#SBATCH --gpus-per-node=8` (not --gpus-per-task), no --gpu-bind on
    srun (every GCD stays in the task's cgroup), one thread a rank on the page's map_cpu cores, and each rank
    started through the wrapper, which exports ROCR_VISIBLE_DEVICES=$SLURM_LOCALID."""
    text = render_plan(
        make_plan("lumi-g", nodes=2, cpus_per_rank=1, account="project_465000000", command=["./app"])
    )
    check_shellcheck(tmp_path, text)
    directives = [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    assert set(LUMI_SBATCH) <= set(directives)
    assert not any(d.startswith("--gpus-per-task") for d in directives)
    words = _srun_words(text)
    assert f"--cpu-bind={LUMI_MAP_CPU}" in words
    assert not any(w.startswith(("--gpu-bind", "--gpus-per-task")) for w in words)
    assert words[-3:] == ["bash", "$HPCRING_AFFINITY", "./app"]
    # The page's export is for programs linked with the GPU transfer library: only on request.
    assert "MPICH_GPU_SUPPORT_ENABLED" not in text
    aware = make_plan("lumi-g", nodes=2, account="p", command=["./app"], gpu_aware_mpi=True)
    assert "export MPICH_GPU_SUPPORT_ENABLED=1" in render_plan(aware).splitlines()
    content = make_plan("lumi-g", nodes=2, account="p", command=["./app"]).files[0].content
    check_shellcheck(tmp_path, content, "affinity.sh")
    for local in range(8):
        # select_gpu's own result for this rank, by its own rule.
        expected = LUMI_SELECT_GPU.split("=$")[0].removeprefix("export ") + "=" + str(local)
        res = _run_wrapper(
            tmp_path,
            content,
            {"SLURM_LOCALID": str(local)},
            'echo "ROCR_VISIBLE_DEVICES=$ROCR_VISIBLE_DEVICES"',
        )
        assert res.returncode == 0 and res.stdout.strip() == expected
    res = _run_wrapper(tmp_path, content, {"PALS_LOCAL_RANKID": "0"}, "true")
    assert res.returncode == 2 and "SLURM_LOCALID" in res.stderr


def test_lumi_g_hybrid_job_mask_and_wrapper() -> None:
    """lumig-job, "Hybrid MPI+OpenMP job": the same select_gpu and --gpus-per-node=8 with a mask_cpu list;
    hpcring's default (7 cores a rank) gives distribution-binding's fe... masks; the hybrid example's 7e...
    masks are 6 of those 7 cores (its OMP_NUM_THREADS=6)."""
    masks = _as_written(
        "fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000", ","
    )
    hybrid = _as_written(
        "7e000000000000,7e00000000000000,7e0000,7e000000,7e,7e00,7e00000000,7e0000000000", ","
    )
    text = render_plan(make_plan("lumi-g", nodes=2, account="p", command=["./app"]))
    bind = next(w for w in _srun_words(text) if w.startswith("--cpu-bind="))
    got = bind.removeprefix("--cpu-bind=mask_cpu:").split(",")
    assert [int(m, 16) for m in got] == [int(m, 16) for m in masks]
    assert all(int(h, 16) & ~int(m, 16) == 0 for h, m in zip(hybrid, got, strict=True))
    assert "--gpus-per-node=8" in _srun_words(text)


def test_lumi_g_two_gcds_per_rank(tmp_path: Path) -> None:
    """Beyond the page (one GCD a rank): with 2 GCDs a rank the wrapper keeps the mapping's pairs, so each
    rank sees both GCDs of one MI250X, and the job asks for every GCD of the node."""
    p = make_plan("lumi-g", nodes=1, gpus_per_rank=2, account="p", command=["./app"])
    assert "--gpus-per-node=8" in _srun_words(render_plan(p))
    for local, expected in enumerate(["0,1", "2,3", "4,5", "6,7"]):
        res = _run_wrapper(
            tmp_path, p.files[0].content, {"SLURM_LOCALID": str(local)}, 'echo "$ROCR_VISIBLE_DEVICES"'
        )
        assert res.stdout.strip() == expected


def test_lumi_g_map_format_shows_the_wrapper() -> None:
    res = cli("map", "--profile", "lumi-g", "--nodes", "1", "--format", "srun")
    assert res.returncode == 0, res.stderr
    assert "--gpus-per-node=8" in res.stdout and 'export ROCR_VISIBLE_DEVICES="$devices"' in res.stdout


# running-jobs-aurora, gpu_tile_compact.sh listing (verbatim lines) and the frameworks module's setting.
AURORA_PCI_ORDER = "export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1"
AURORA_FRAMEWORKS = "export ZE_FLAT_DEVICE_HIERARCHY=FLAT"


@pytest.mark.parametrize("local", range(12))
def test_aurora_wrapper_flat_mode_one_tile_a_rank(local: int, tmp_path: Path) -> None:
    """12 ranks a node, one tile each. In FLAT mode (the frameworks module's, for PyTorch) each tile is one
    device numbered 0..11 in PCI order, so the mask is ALCF's per-device form `ZE_AFFINITY_MASK=$gpu_id`
    with gpu_id = the local rank (num_gpus=12); gpu_tile_compact.sh's COMPOSITE `gpu.tile` for the same rank
    names the same tile: gpu_id = local // 2, tile_id = local % 2 -> FLAT device 2 * gpu_id + tile_id."""
    p = make_plan("aurora", nodes=2, account="MyProject", command=["python", "train.py"])
    content = p.files[0].content
    check_shellcheck(tmp_path, content, "affinity.sh")
    assert AURORA_PCI_ORDER in content.splitlines() and AURORA_FRAMEWORKS in content.splitlines()
    probe = 'echo "$ZE_FLAT_DEVICE_HIERARCHY $ZE_ENABLE_PCI_ID_DEVICE_ORDER $ZE_AFFINITY_MASK"'
    res = _run_wrapper(tmp_path, content, {"PALS_LOCAL_RANKID": str(local)}, probe)
    gpu_id, tile_id = local // 2, local % 2  # gpu_tile_compact.sh's arithmetic
    assert res.returncode == 0 and res.stdout.split() == ["FLAT", "1", str(2 * gpu_id + tile_id)]


def test_aurora_wrapper_two_tiles_a_rank_is_one_gpu(tmp_path: Path) -> None:
    """6 ranks, one whole GPU each (the page's `--gpu-bind=list:0:1:2:3:4:5` layout): in FLAT mode that is
    the GPU's two tiles, FLAT devices 2g and 2g+1, on the page's cores 1-16:17-32:33-48:53-68:69-84:85-100."""
    p = make_plan("aurora", nodes=1, gpus_per_rank=2, cpus_per_rank=16, account="MyProject", command=["./a"])
    text = render_plan(p)
    words = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("mpiexec ")))
    cpu_list = words[words.index("--cpu-bind") + 1].removeprefix("list:").split(":")
    assert [cpuset.parse(c) for c in cpu_list] == [
        cpuset.parse(c) for c in _as_written("1-16:17-32:33-48:53-68:69-84:85-100", ":")
    ]
    for g in range(6):
        res = _run_wrapper(
            tmp_path, p.files[0].content, {"PALS_LOCAL_RANKID": str(g)}, 'echo "$ZE_AFFINITY_MASK"'
        )
        assert res.stdout.strip() == f"{2 * g},{2 * g + 1}"


# Rank order where the site documents one (profiles: site.rank_order).
# OLCF Frontier user guide (https://docs.olcf.ornl.gov/systems/frontier_user_guide.html), "Process and Thread
# Mapping Examples", Example 1, `srun -N1 -n8 -c7 --gpus-per-task=1 --gpu-bind=closest`: (MPI rank, first
# and last HWT, GPU_ID) from its output lines.
FRONTIER_EXAMPLE_1 = [(0, 1, 7, 4), (1, 9, 15, 5), (2, 17, 23, 2), (3, 25, 31, 3)]
FRONTIER_EXAMPLE_1 += [(4, 33, 39, 6), (5, 41, 47, 7), (6, 49, 55, 0), (7, 57, 63, 1)]


def test_frontier_rank_order_as_olcf_example_1(tmp_path: Path) -> None:
    """Local rank i on the i-th 7-core block with the GCD `closest` picks for it; the srun line lists the
    masks in that order, so Slurm's closest binding gives each rank the GCD the mapping says."""
    p = make_plan("frontier", nodes=1, account="abc123", command=["./hello_jobstep"])
    text = render_plan(p)
    check_shellcheck(tmp_path, text)
    words = _srun_words(text)
    assert {"--gpus-per-task=1", "--gpu-bind=closest", "--cpus-per-task=7"} <= set(words)
    masks = next(w for w in words if w.startswith("--cpu-bind=")).removeprefix("--cpu-bind=mask_cpu:")
    cores = [[b for b in range(64) if int(m, 16) >> b & 1] for m in masks.split(",")]
    assert [(i, c[0], c[-1]) for i, c in enumerate(cores)] == [
        (r, lo, hi) for r, lo, hi, _ in FRONTIER_EXAMPLE_1
    ]
    record = json.loads(cli("map", "--profile", "frontier", "--nodes", "1", "--format", "json").stdout)
    assert [(r["local_rank"], r["gpus"][0]) for r in record] == [(r, g) for r, _, _, g in FRONTIER_EXAMPLE_1]


def test_polaris_rank_order_as_set_affinity_gpu_polaris(tmp_path: Path) -> None:
    """https://docs.alcf.anl.gov/polaris/running-jobs/using-gpus/: `mpiexec --depth=8 --cpu-bind depth
    ./set_affinity_gpu_polaris.sh`, which exports CUDA_VISIBLE_DEVICES=$((num_gpus - 1 - PMI_LOCAL_RANK %
    num_gpus)): local rank i on cores 8i..8i+7 (depth binding) with GPU 3-i. hpcring's job gives every local
    rank the same cores and, through its wrapper, the same CUDA_VISIBLE_DEVICES."""
    num_gpus, depth = 4, 8
    p = make_plan("polaris", nodes=2, account="MyProject", command=["./hello_affinity"])
    text = render_plan(p)
    words = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("mpiexec ")))
    cpu_list = words[words.index("--cpu-bind") + 1].removeprefix("list:").split(":")
    assert [cpuset.parse(c) for c in cpu_list] == [
        tuple(range(depth * i, depth * i + depth)) for i in range(num_gpus)
    ]
    assert words[words.index("--depth") + 1] == str(depth)
    for local in range(num_gpus):
        res = _run_wrapper(
            tmp_path, p.files[0].content, {"PMI_LOCAL_RANK": str(local)}, 'echo "$CUDA_VISIBLE_DEVICES"'
        )
        assert res.returncode == 0 and res.stdout.strip() == str(num_gpus - 1 - local % num_gpus)
