"""Mapping on the built-in profiles: the placements the sites document, every output format, impossible
shapes."""

from __future__ import annotations

import json

import pytest
from sched_helpers import cli

from hpcring.errors import ConfigError, JobShapeError
from hpcring.schedulers import cpuset, mapping, profile
from hpcring.schedulers.job import JobSpec


def build(name: str, **job: object) -> mapping.RankMap:
    return mapping.build(profile.load(name), JobSpec(**job))  # type: ignore[arg-type]


def test_frontier_one_rank_per_gcd_on_its_closest_cores() -> None:
    rm = build("frontier", nodes=2)
    assert rm.shape.ranks == 16 and rm.shape.cpus_per_rank == 7
    first = {r.slot.gpus[0]: cpuset.format_list(r.slot.cpus) for r in rm.ranks() if r.node == 0}
    # OLCF node diagram: GCD0 49-55, GCD1 57-63, GCD2 17-23, GCD3 25-31, GCD4 1-7, GCD5 9-15, GCD6 33-39, GCD7
    # 41-47
    assert first == {
        0: "49-55",
        1: "57-63",
        2: "17-23",
        3: "25-31",
        4: "1-7",
        5: "9-15",
        6: "33-39",
        7: "41-47",
    }
    ranks = list(rm.ranks())
    assert [r.node for r in ranks] == [0] * 8 + [1] * 8
    assert ranks[8].slot == ranks[0].slot


def test_frontier_smt2_uses_both_threads() -> None:
    rm = build("frontier", nodes=1, threads_per_core=2)
    # Local rank 0 on the first usable cores (rank_order: cores, OLCF's Example 1 order), GCD 4's.
    assert rm.slots(0)[0].gpus == (4,)
    assert rm.slots(0)[0].cpus == (*range(1, 8), *range(65, 72))


def test_summit_six_ranks_seven_cores_smt4() -> None:
    rm = build("summit", nodes=1)
    slots = rm.slots(0)
    assert [cpuset.format_list(s.cpus) for s in slots] == [
        "0-27",
        "28-55",
        "56-83",
        "88-115",
        "116-143",
        "144-171",
    ]
    assert [s.nic for s in slots] == ["mlx5_0"] * 3 + ["mlx5_3"] * 3


def test_perlmutter_four_ranks_16_cores_each_on_the_gpu_numa() -> None:
    rm = build("perlmutter-gpu", nodes=1)
    assert rm.shape.cpus_per_rank * rm.shape.threads_per_core == 32  # NERSC: -c 32 for 4 ranks per node
    assert [cpuset.format_list(s.cores) for s in rm.slots(0)] == ["48-63", "32-47", "16-31", "0-15"]


def test_cpu_only_profile_splits_per_numa_domain() -> None:
    rm = build("generic-lsf", nodes=3, ranks_per_node=4)
    assert [cpuset.format_list(s.cpus) for s in rm.slots(0)] == ["0-9", "10-19", "20-29", "30-39"]
    assert all(s.gpus == () for s in rm.slots(0))


def test_explicit_cpus_per_rank_and_gpus_per_rank() -> None:
    rm = build("frontier", nodes=1, ranks_per_node=4, gpus_per_rank=2, cpus_per_rank=10)
    slots = rm.slots(0)
    # Local ranks in core order (rank_order: cores): the MI250X on NUMA 0 (GCDs 4, 5) first.
    assert [s.gpus for s in slots] == [(4, 5), (2, 3), (6, 7), (0, 1)]
    assert all(len(s.cores) == 10 for s in slots)
    assert {c for c in slots[3].cores} <= set(range(48, 64))


def test_uneven_ranks_when_allowed() -> None:
    import dataclasses

    prof = profile.load("generic-lsf")
    prof = dataclasses.replace(prof, site=dataclasses.replace(prof.site, require_even_ranks=False))
    rm = mapping.build(prof, JobSpec(nodes=3, ranks=8))
    counts = [sum(1 for r in rm.ranks() if r.node == n) for n in range(3)]
    assert counts == [3, 3, 2]
    assert [r.rank for r in rm.ranks()] == list(range(8))
    assert rm.first_rank(2) == 6


IMPOSSIBLE = [
    (
        "frontier",
        {"ranks_per_node": 16},
        "more GPUs than the node has: 16 ranks x 1 GPU(s) = 16 > 8 GPUs per node",
    ),
    ("frontier", {"gpus_per_rank": 4, "ranks_per_node": 4}, "4 ranks x 4 GPU(s) = 16 > 8"),
    (
        "frontier",
        {"cpus_per_rank": 8},
        "cores oversubscribed: 8 ranks x 8 cores = 64 > 56 usable cores per node (8",
    ),
    ("generic-lsf", {"ranks_per_node": 41}, "cores oversubscribed: 41 ranks per node > 40 usable cores"),
    (
        "generic-lsf",
        {"gpus_per_rank": 1},
        "1 GPU(s) per rank asked, but profile 'generic-lsf' nodes have no GPUs",
    ),
    (
        "frontier",
        {"time_s": 3 * 3600},
        "walltime 03:00:00 exceeds the limit of 02:00:00 for 1 node(s) in partition",
    ),
    ("frontier", {"nodes": 9409}, "9409 nodes exceed the 9408-node limit of partition 'batch'"),
    (
        "summit",
        {"nodes": 10, "time_s": 3 * 3600},
        "exceeds the limit of 02:00:00 for 10 node(s) in queue 'batch'",
    ),
    ("generic-lsf", {"nodes": 3, "ranks": 10}, "10 ranks do not divide evenly over 3 nodes"),
    (
        "generic-lsf",
        {"nodes": 2, "ranks": 4, "ranks_per_node": 3},
        "ranks (4) != nodes (2) x ranks per node (3)",
    ),
    ("frontier", {"threads_per_core": 4}, "threads per core 4 is not possible; the node has 2"),
]


@pytest.mark.parametrize(("name", "job", "message"), IMPOSSIBLE, ids=[m[2][:40] for m in IMPOSSIBLE])
def test_impossible_shapes_say_why(name: str, job: dict[str, object], message: str) -> None:
    with pytest.raises(JobShapeError) as info:
        build(name, **job)
    assert message in str(info.value)


def test_walltime_bins_allow_longer_jobs_for_bigger_allocations() -> None:
    assert build("frontier", nodes=200, time_s=12 * 3600).shape.time_s == 12 * 3600


def test_unknown_partition_lists_choices() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown partition 'gpu' on 'perlmutter-gpu'; allowed: 'regular', 'debug', 'shared', "
        r"'preempt', 'premium' or 'overrun'",
    ):
        build("perlmutter-gpu", partition="gpu")


def test_cli_map_json_records() -> None:
    res = cli("map", "--profile", "frontier", "--nodes", "2", "--format", "json")
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)
    assert len(records) == 16
    assert records[9] == {
        "rank": 9,
        "node": 1,
        "local_rank": 1,
        "gpus": [5],
        "cpus": list(range(9, 16)),
        "nic": "hsn2",
    }


def test_cli_map_formats() -> None:
    erf = cli("map", "--profile", "summit", "--nodes", "1", "--format", "erf")
    assert erf.stdout.splitlines()[:2] == [
        "cpu_index_using: physical",
        "rank: 0: { host: 1; cpu: {0-27} ; gpu: {0} }",
    ]
    assert "jsrun --erf_input" in erf.stderr
    rf = cli("map", "--profile", "generic-lsf", "--nodes", "2", "--format", "rankfile")
    assert rf.stdout.splitlines() == [
        "rank 0=+n0 slot=0-19",
        "rank 1=+n0 slot=20-39",
        "rank 2=+n1 slot=0-19",
        "rank 3=+n1 slot=20-39",
    ]
    srun = cli(
        "map", "--profile", "generic-slurm-gpu", "--nodes", "1", "--ranks-per-node", "2", "--format", "srun"
    )
    assert "--cpu-bind=mask_cpu:0xffff,0xffff0000" in srun.stdout
    assert "--gpu-bind=map_gpu:0,1" in srun.stdout
    table = cli("map", "--profile", "frontier", env={"HPCRING_NODES": "1"})
    assert table.returncode == 0 and len(table.stdout.splitlines()) == 9


def test_cli_map_env_defaults_and_errors() -> None:
    res = cli("map", "--format", "json", env={"HPCRING_PROFILE": "generic-lsf", "HPCRING_NODES": "3"})
    assert len(json.loads(res.stdout)) == 6
    bad = cli("map", "--profile", "frontier", env={"HPCRING_NODES": "two"})
    assert bad.returncode == 2 and "--nodes [HPCRING_NODES]: 'two' has the wrong type" in bad.stderr
    none = cli("map")
    assert none.returncode == 2 and "no profile given" in none.stderr and "Traceback" not in none.stderr
    shape = cli("map", "--profile", "frontier", "--ranks-per-node", "9")
    assert shape.returncode == 2 and "more GPUs than the node has" in shape.stderr


def test_json_lines_equal_the_records() -> None:
    import dataclasses

    prof = profile.load("generic-lsf")
    prof = dataclasses.replace(prof, site=dataclasses.replace(prof.site, require_even_ranks=False))
    for rm in (build("summit", nodes=3), mapping.build(prof, JobSpec(nodes=3, ranks=7))):
        assert [json.loads(line) for line in rm.json_lines()] == rm.as_json_list()
