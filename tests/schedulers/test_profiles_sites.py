"""Each new built-in site reproduces the per-rank core/GPU affinity its own documentation gives.

Every expectation below is copied from the cited page (a binding list, a mask, an affinity table), never from
hpcring's output; the profile YAML cites the same pages for the node facts.
"""

from __future__ import annotations

import json
import shlex

import pytest
from sched_helpers import cli, make_plan, render_plan

from hpcring.schedulers import cpuset, mapping, profile
from hpcring.schedulers.job import JobSpec


def _slots(name: str, **job: object) -> tuple[mapping.Slot, ...]:
    rm = mapping.build(profile.load(name), JobSpec(nodes=1, **job))  # type: ignore[arg-type]
    return rm.slots(0)


def _as_written(text: str, sep: str) -> list[str]:
    """A binding list exactly as the documentation writes it, split into its per-rank entries."""
    return text.split(sep)


def _mask_cores(mask: str) -> list[int]:
    value = int(mask, 16)
    return [b for b in range(value.bit_length()) if value >> b & 1]


def test_lumi_g_gpu_binding_page() -> None:
    """docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/, "GPU Binding": local rank i
    uses GCD i, `--cpu-bind=map_cpu:49,57,17,25,1,9,33,41` for one thread and the mask_cpu list (7 cores a
    rank, `--cpus-per-task=7`) for hybrid ranks."""
    masks = _as_written(
        "fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000", ","
    )
    slots = _slots("lumi-g")
    assert [s.gpus for s in slots] == [(i,) for i in range(8)]
    assert [list(s.cores) for s in slots] == [_mask_cores(m) for m in masks]
    assert [s.cpus for s in slots] == [s.cores for s in slots]  # one thread per core (Slurm's default)
    single = _slots("lumi-g", cpus_per_rank=1)
    assert [s.cores[0] for s in single] == [49, 57, 17, 25, 1, 9, 33, 41]


def test_lumi_c_ccd_spread() -> None:
    """distribution-binding, "Custom binding": 16 ranks a node, one per CCD (`map_cpu:0,8,...,120`); with 8
    cores a rank each rank owns its whole CCD (L3 region) and the ranks are spread over both sockets."""
    slots = _slots("lumi-c", ranks_per_node=16, cpus_per_rank=8)
    assert [s.cores[0] for s in slots] == list(range(0, 128, 8))
    assert [s.cores for s in slots] == [tuple(range(c, c + 8)) for c in range(0, 128, 8)]
    assert slots[0].gpus == () and slots[0].nic is None
    both_threads = _slots("lumi-c", ranks_per_node=2, cpus_per_rank=1, threads_per_core=2)
    assert both_threads[0].cpus == (0, 128)  # `--cpu-bind=cores`: "affinity list: 0,128"


def test_polaris_device_affinity_table() -> None:
    """docs.alcf.anl.gov/polaris/hardware-overview/machine-overview/, "Polaris Device Affinity Information":
    GPU0 24-31,56-63; GPU1 16-23,48-55; GPU2 8-15,40-47; GPU3 0-7,32-39; mlx5_0 beside GPU3, mlx5_1 beside
    GPU1 (the table's Slingshot-10 names: the Slingshot-11 adapters are hsn0 and hsn1, polaris.yaml). (The
    running-jobs page's script gives local rank i GPU 3-i with cores 8i..8i+7: the same pairs.)"""
    table = {0: "24-31,56-63", 1: "16-23,48-55", 2: "8-15,40-47", 3: "0-7,32-39"}
    slots = _slots("polaris", threads_per_core=2)
    assert {s.gpus[0]: s.cpus for s in slots} == {g: cpuset.parse(c) for g, c in table.items()}
    nic_of = {s.gpus[0]: s.nic for s in slots}
    assert nic_of[3] == "hsn0" and nic_of[1] == "hsn1"


def test_aurora_tile_binding() -> None:
    """docs.alcf.anl.gov/aurora/running-jobs-aurora/: 12 ranks, one per GPU tile:
    `--cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100` and
    `--gpu-bind=list:0.0:0.1:1.0:1.1:...:5.1`; 6 ranks, one per GPU:
    `list:1-16:17-32:33-48:53-68:69-84:85-100` with GPUs 0..5. Cores 0 and 52 are reserved."""
    cpu_list = _as_written("1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100", ":")
    tiles = _as_written("0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1", ":")
    slots = _slots("aurora")
    assert [s.cores for s in slots] == [cpuset.parse(c) for c in cpu_list]
    assert [f"{d}.{t}" for s in slots for d, t in s.tiles] == tiles
    per_gpu = _slots("aurora", gpus_per_rank=2, cpus_per_rank=16)
    assert [s.cores for s in per_gpu] == [
        cpuset.parse(c) for c in _as_written("1-16:17-32:33-48:53-68:69-84:85-100", ":")
    ]
    assert [{d for d, _ in s.tiles} for s in per_gpu] == [{g} for g in range(6)]
    # daos-overview, "NIC and Core Binding": NICs 0-3 serve socket 0, NICs 4-7 socket 1.
    assert {s.nic for s in slots[:6]} == {"cxi0", "cxi1", "cxi2", "cxi3"}
    assert {s.nic for s in slots[6:]} == {"cxi4", "cxi5", "cxi6", "cxi7"}
    record = json.loads(cli("map", "--profile", "aurora", "--nodes", "1", "--format", "json").stdout)[1]
    assert record["tiles"] == ["0.1"] and record["cpus"] == list(range(9, 17))


def test_alps_gh200_affinity_examples() -> None:
    """docs.cscs.ch/running/slurm/: `srun -n8 -N2 -c72` gives ranks 0-3 of a node cores [0:71], [72:143],
    [144:215], [216:287]; with `--gpus-per-task=1` each rank owns its own GPU."""
    slots = _slots("alps-gh200")
    assert [s.cores for s in slots] == [tuple(range(72 * i, 72 * i + 72)) for i in range(4)]
    assert [s.gpus for s in slots] == [(0,), (1,), (2,), (3,)]
    assert [s.nics for s in slots] == [("hsn0",), ("hsn1",), ("hsn2",), ("hsn3",)]


def test_el_capitan_systems_apu_per_socket() -> None:
    """hpc.llnl.gov/node/1244 ("El Capitan Systems"): 4 MI300A, "each allocated to its own socket ...
    (defining a NUMA domain)", 24 cores each (AMD's MI300A page). That page gives no per-rank table (LLNL's
    CUG'24 tutorial does: test_el_capitan_systems_flux_map_affinity), so this checks the one it implies: rank
    i on APU i, its 24 cores, its GPU, its memory on NUMA domain i."""
    for name in ("tuolumne", "el-capitan"):
        slots = _slots(name)
        assert [s.cores for s in slots] == [tuple(range(24 * i, 24 * i + 24)) for i in range(4)]
        assert [(s.gpus, s.mem_numa, s.apu) for s in slots] == [((i,), (i,), True) for i in range(4)]
        record = json.loads(cli("map", "--profile", name, "--nodes", "1", "--format", "json").stdout)[2]
        assert record["mem_numa"] == [2] and record["gpus"] == [2]


# github.com/LLNL/mpibind/blob/master/tutorials/cug24/module4.md ("Flux affinity on the AMD MI300A APU", on
# RZAdams, the El Capitan systems' node), "Controlling affinity with Flux": 4 tasks, one GPU each, each on
# 2 cores local to its GPU with both hardware threads (`flux run -N1 -n4 -g1 -o gpu-affinity=per-task -o
# cpu-affinity='map:...'`), and the output "Task i/4 has 1 GPUs: 000i:02", i.e. GPU i (the page's table:
# GPU i is 0x000i:02, local to cores 24i..24i+23).
MI300A_MAP = "map:0-1,96-97;24-25,120-121;48-49,144-145;72-73,168-169"


def _flux_options(text: str) -> dict[str, str]:
    """The `-o KEY=VALUE` options of the script's `flux run` line."""
    line = next(ln for ln in text.splitlines() if ln.startswith("flux run "))
    words = shlex.split(line)
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "-o")


@pytest.mark.parametrize("name", ["tuolumne", "el-capitan"])
def test_el_capitan_systems_flux_map_affinity(name: str) -> None:
    """module4.md's mapped table: task i on CPUs 24i,24i+1 and their second threads 96+24i,96+24i+1, GPU i;
    both in the RankMap and in the rendered `flux run` line. Per-task binding is not used: the same page shows
    it putting every task on cores 88-95 ("Only process 3 is using a local GPU")."""
    tasks = [cpuset.parse(c) for c in _as_written(MI300A_MAP.removeprefix("map:"), ";")]
    job = {"ranks_per_node": 4, "cpus_per_rank": 2, "threads_per_core": 2, "gpus_per_rank": 1}
    slots = _slots(name, **job)
    assert [s.cpus for s in slots] == tasks
    assert [s.gpus for s in slots] == [(0,), (1,), (2,), (3,)]
    text = render_plan(make_plan(name, nodes=1, command=["./mpi+gpu"], **job))
    opts = _flux_options(text)
    assert opts["cpu-affinity"] == MI300A_MAP  # the tutorial's own string
    assert [cpuset.parse(c) for c in opts["cpu-affinity"].removeprefix("map:").split(";")] == tasks
    assert [cpuset.parse(g) for g in opts["gpu-affinity"].removeprefix("map:").split(";")] == [
        (0,),
        (1,),
        (2,),
        (3,),
    ]
    # module4.md's geometry words: -N1 -n4, `-c<ncores-per-task>` (cores, 2 here), -g1.
    words = shlex.split(next(ln for ln in text.splitlines() if ln.startswith("flux run ")))
    assert words[2:10] == ["-N", "1", "-n", "4", "-c", "2", "-g", "1"]


@pytest.mark.parametrize("name", ["tuolumne", "el-capitan"])
def test_el_capitan_systems_default_rank_per_apu(name: str) -> None:
    """The default job, one rank per APU: rank i on all 24 cores local to GPU i (24i..24i+23, module4.md) and,
    since Flux gives a task both hardware threads of its cores ("one core per task (two hardware threads or
    CPUs per task)"), their second threads 96+24i..96+24i+23 ("88-89,184-185": core c's sibling is c+96)."""
    slots = _slots(name)
    assert [s.cores for s in slots] == [tuple(range(24 * i, 24 * i + 24)) for i in range(4)]
    assert [s.cpus for s in slots] == [
        cpuset.parse(f"{24 * i}-{24 * i + 23},{96 + 24 * i}-{96 + 24 * i + 23}") for i in range(4)
    ]
    assert [s.gpus for s in slots] == [(i,) for i in range(4)]
    opts = _flux_options(render_plan(make_plan(name, nodes=1, command=["./mpi+gpu"])))
    assert opts["cpu-affinity"] == "map:0-23,96-119;24-47,120-143;48-71,144-167;72-95,168-191"
    assert opts["gpu-affinity"] == "map:0;1;2;3"
