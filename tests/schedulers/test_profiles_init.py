"""`hpcring profiles init` on recorded /sys trees and recorded tool outputs (see init_samples.py), through the
real CLI: the written profile validates, maps (`hpcring map`) and renders a shellcheck-clean script; and on
this machine's own /sys. Parser tests feed each parser its tool's documented output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import init_samples as s
import pytest
import yaml
from sched_helpers import cli, shellcheck

from hpcring.errors import ProfileError
from hpcring.schedulers import profile
from hpcring.schedulers.profile_init import (
    flux_facts,
    hwloc,
    lsf_facts,
    nvidia,
    pbs_facts,
    rocm,
    slurm_facts,
    sysfs,
)


def _record(directory: Path, **outputs: str) -> Path:
    directory.mkdir()
    for source, text in outputs.items():
        (directory / f"{source.replace('_', '-')}.txt").write_text(text)
    return directory


def _init(tmp_path: Path, root: Path, recorded: Path, *extra: str) -> tuple[Path, dict[str, object]]:
    out = tmp_path / "site.yaml"
    res = cli(
        "profiles", "init", "--sysfs-root", str(root), "--from-dir", str(recorded), "-o", str(out), *extra
    )
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}" in res.stdout
    data: dict[str, object] = yaml.safe_load(out.read_text())
    return out, data


def _round_trip(tmp_path: Path, path: Path, ranks: int) -> list[dict[str, object]]:
    """validate, map (JSON) and render + shellcheck the written profile through the CLI."""
    assert cli("profiles", "validate", str(path)).returncode == 0
    mapped = cli("map", "--profile", str(path), "--nodes", "2", "--format", "json")
    assert mapped.returncode == 0, mapped.stderr
    records: list[dict[str, object]] = json.loads(mapped.stdout)
    assert len(records) == 2 * ranks
    script = tmp_path / "job.sh"
    rendered = cli(
        "render", "--profile", str(path), "--nodes", "2", "-o", str(script), "--", "python", "t.py"
    )
    assert rendered.returncode == 0, rendered.stderr
    shellcheck(script)
    return records


def test_slurm_gpu_node(tmp_path: Path) -> None:
    root = s.sys_tree(
        tmp_path / "sys",
        sockets=2,
        cores_per_socket=4,
        threads=2,
        numa=["0-3", "4-7"],
        ib={"mlx5_0": 0, "mlx5_1": 1},
        net={"ib0": 0},
    )
    rec = _record(
        tmp_path / "rec",
        nvidia_smi_topo=s.NVIDIA_TOPO,
        scontrol_config=s.SCONTROL_CONFIG,
        scontrol_partition=s.SCONTROL_PARTITION,
        sinfo=s.SINFO,
    )
    path, data = _init(tmp_path, root, rec)
    node, site = data["node"], data["site"]
    assert isinstance(node, dict) and isinstance(site, dict)
    assert data["name"] == "gpucluster"  # Slurm's ClusterName
    assert (node["sockets"], node["cores_per_socket"], node["threads_per_core"]) == (2, 4, 2)
    assert node["numa"] == [{"id": 0, "cores": "0-3"}, {"id": 1, "cores": "4-7"}]
    assert node["gpu_vendor"] == "nvidia"
    assert node["gpus"] == [{"index": i, "numa": i // 2} for i in range(4)]
    assert node["nics"] == [
        {"name": "mlx5_0", "numa": 0, "gpus": [0, 1]},
        {"name": "mlx5_1", "numa": 1, "gpus": [2, 3]},
    ]
    assert node["interconnect"] == "infiniband"
    assert site["scheduler"] == "slurm" and site["launcher"] == "srun" and site["slurm"] == {"mpi": "pmix"}
    assert site["partitions"] == [
        {
            "name": "batch",
            "max_walltime": "2-00:00:00",
            "max_nodes": 64,
            "default": True,
            "selector": "partition",
        },
        {"name": "debug", "max_walltime": "00:30:00", "max_nodes": 2, "selector": "partition"},
    ]
    text = path.read_text()
    assert "# TODO - {name: long, max_walltime: ...}" in text  # MaxTime=UNLIMITED: a placeholder
    assert "# TODO reserved_cores:" in text
    records = _round_trip(tmp_path, path, ranks=4)
    assert records[2]["gpus"] == [2] and records[2]["nic"] == "mlx5_1"  # the NIC on GPU 2's PCIe switch
    assert records[0]["cpus"] == [0, 1]  # GPU 0's NUMA domain, 2 cores each


def test_slurm_from_sinfo_only_and_roce(tmp_path: Path) -> None:
    root = s.sys_tree(
        tmp_path / "sys",
        sockets=1,
        cores_per_socket=8,
        threads=1,
        numa=["0-7"],
        ib={"mlx5_0": 0},
        link_layer="Ethernet",
    )
    path, data = _init(tmp_path, root, _record(tmp_path / "rec", sinfo=s.SINFO), "--name", "edge")
    site = data["site"]
    assert isinstance(site, dict) and data["name"] == "edge"
    assert [p["name"] for p in site["partitions"]] == ["batch", "debug"]
    assert site["partitions"][0]["default"] is True and "max_nodes" not in site["partitions"][0]
    assert data["node"]["interconnect"] == "roce"  # type: ignore[index]
    _round_trip(tmp_path, path, ranks=1)


def test_pbs_amd_node(tmp_path: Path) -> None:
    root = s.sys_tree(
        tmp_path / "sys", sockets=1, cores_per_socket=8, threads=2, numa=["0-1", "2-3", "4-5", "6-7"]
    )
    rec = _record(
        tmp_path / "rec", rocm_smi_toponuma=s.ROCM_TOPONUMA, qstat_queues=s.QSTAT_QF, qstat_server=s.QSTAT_BF
    )
    path, data = _init(tmp_path, root, rec, "--name", "pbs-site")
    node, site = data["node"], data["site"]
    assert isinstance(node, dict) and isinstance(site, dict)
    assert node["gpu_vendor"] == "amd"
    assert [g["numa"] for g in node["gpus"]] == [3, 3, 1, 1, 0, 0, 2, 2]
    assert (site["scheduler"], site["launcher"]) == ("pbs", "mpiexec")
    assert site["partitions"] == [
        {"name": "debug", "max_walltime": "01:00:00", "max_nodes": 2, "default": True, "selector": "queue"},
        {"name": "prod", "max_walltime": "1-00:00:00", "max_nodes": 496, "selector": "queue"},
    ]
    assert "# TODO - {name: workq, max_walltime: ...}" in path.read_text()
    records = _round_trip(tmp_path, path, ranks=8)
    assert records[0]["gpus"] == [0] and records[0]["cpus"] == [6]  # GCD 0 sits on NUMA 3 (core 6-7)


def test_flux_from_hwloc_when_sys_has_no_topology(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    rec = _record(tmp_path / "rec", lstopo=s.LSTOPO_XML, flux_resource=s.FLUX_RESOURCES)
    path, data = _init(tmp_path, tmp_path / "sys", rec, "--name", "fluxy")
    node, site = data["node"], data["site"]
    assert isinstance(node, dict) and isinstance(site, dict)
    assert (node["sockets"], node["cores_per_socket"], node["threads_per_core"]) == (1, 4, 2)
    assert node["numa"] == [{"id": 0, "cores": "0-3"}] and node["gpus"] == []
    assert (site["scheduler"], site["launcher"], site["partitions"]) == ("flux", "flux", [])
    assert "flux resource list: 2 nodes, 16 cores, 0 GPUs" in path.read_text()
    _round_trip(tmp_path, path, ranks=1)


def test_lsf_queues_without_limits_stay_placeholders(tmp_path: Path) -> None:
    root = s.sys_tree(
        tmp_path / "sys", sockets=2, cores_per_socket=2, threads=1, numa=["0-1", "2-3"], net={"eth0": None}
    )
    path, data = _init(tmp_path, root, _record(tmp_path / "rec", bqueues=s.BQUEUES), "--name", "lsf-site")
    site = data["site"]
    assert isinstance(site, dict) and (site["scheduler"], site["launcher"], site["partitions"]) == (
        "lsf",
        "mpirun",
        [],
    )
    text = path.read_text()
    assert "# TODO - {name: priority, max_walltime: ...}" in text and "# TODO - {name: normal" in text
    assert data["node"]["nics"] == [{"name": "eth0"}]  # type: ignore[index]
    _round_trip(tmp_path, path, ranks=2)


def test_this_machine(tmp_path: Path) -> None:
    """The real /sys of the machine running the tests (and whatever tools it has)."""
    out = tmp_path / "here.yaml"
    # --scheduler: this machine may run no batch system, and init refuses to guess one.
    res = cli("profiles", "init", "--name", "here", "--scheduler", "slurm", "-o", str(out))
    assert res.returncode == 0, res.stderr
    prof = profile.load(str(out))
    assert prof.node.cores * prof.node.threads_per_core == os.cpu_count()
    _round_trip(tmp_path, out, ranks=len(prof.node.numa) if not prof.node.gpus else len(prof.node.gpus))


def test_stdout_env_and_bad_input(tmp_path: Path) -> None:
    root = s.sys_tree(tmp_path / "sys", sockets=1, cores_per_socket=2, threads=1, numa=["0-1"])
    rec = _record(tmp_path / "rec")
    env = {"HPCRING_SYSFS_ROOT": str(root), "HPCRING_INIT_FROM_DIR": str(rec), "HPCRING_INIT_NAME": "x1"}
    res = cli("profiles", "init", env={**env, "HPCRING_INIT_SCHEDULER": "pbs"})
    assert res.returncode == 0, res.stderr
    written = profile.parse(res.stdout, "stdout")
    assert (written.name, written.site.scheduler, written.site.launcher) == ("x1", "pbs", "mpiexec")
    assert "# Note: scheduler pbs given with --scheduler; no batch command answered here" in res.stdout
    taken = tmp_path / "taken.yaml"
    taken.write_text("keep me")
    for argv, message in (
        (("--output", str(taken)), "exists; remove it or choose another file"),
        (("--from-dir", str(tmp_path / "none")), "--from-dir"),
        (("--sysfs-root", str(tmp_path / "nosys")), "--sysfs-root"),
    ):
        bad = cli(
            "profiles", "init", "--sysfs-root", str(root), "--from-dir", str(rec), "--scheduler", "pbs", *argv
        )
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert taken.read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    none = cli("profiles", "init", "--sysfs-root", str(tmp_path / "empty"), "--from-dir", str(rec))
    assert none.returncode == 2 and "no CPU topology found" in none.stderr and "Traceback" not in none.stderr


# --- parsers, one documented output each -------------------------------------------------------------------


def test_no_batch_system_and_no_scheduler_is_refused(tmp_path: Path) -> None:
    """Nothing answered and no --scheduler: init names what it looked for and the allowed schedulers instead
    of writing a Slurm profile as if it had found Slurm; a bad --scheduler names the allowed ones."""
    root = s.sys_tree(tmp_path / "sys", sockets=1, cores_per_socket=2, threads=1, numa=["0-1"])
    rec = _record(tmp_path / "rec")
    out = tmp_path / "site.yaml"
    base = ("profiles", "init", "--sysfs-root", str(root), "--from-dir", str(rec), "-o", str(out))
    res = cli(*base)
    assert res.returncode == 2 and not out.exists(), res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    for looked_for in ("scontrol/sinfo (Slurm)", "qstat (PBS)", "flux resource list (Flux)", "bqueues (LSF)"):
        assert looked_for in line
    assert "pass --scheduler" in line and "allowed: 'slurm', 'pbs', 'flux' or 'lsf'" in line
    bad = cli(*base, "--scheduler", "sge")
    assert bad.returncode == 2 and "--scheduler: 'sge' is not allowed; allowed: 'slurm'" in bad.stderr
    for sched, launcher in (("slurm", "srun"), ("flux", "flux"), ("lsf", "mpirun")):
        out.unlink(missing_ok=True)
        path, data = _init(tmp_path, root, rec, "--scheduler", sched)
        site = data["site"]
        assert isinstance(site, dict) and (site["scheduler"], site["launcher"]) == (sched, launcher)
        assert profile.load(str(path)).site.scheduler == sched


def test_scheduler_flag_wins_over_the_one_found(tmp_path: Path) -> None:
    """--scheduler pbs where Slurm answers: PBS is written, Slurm's partitions are left out, and a note says
    so."""
    root = s.sys_tree(tmp_path / "sys", sockets=1, cores_per_socket=2, threads=1, numa=["0-1"])
    rec = _record(tmp_path / "rec", sinfo=s.SINFO)
    path, data = _init(tmp_path, root, rec, "--scheduler", "pbs")
    site = data["site"]
    assert isinstance(site, dict) and (site["scheduler"], site["partitions"]) == ("pbs", [])
    assert "# Note: scheduler pbs given with --scheduler; slurm answered here" in path.read_text()


def test_nvidia_topo_parser() -> None:
    gpus, nics = nvidia.parse(s.NVIDIA_TOPO)
    assert [(g.index, g.numa, g.cpus[:4]) for g in gpus] == [
        (0, 0, (0, 1, 2, 3)),
        (1, 0, (0, 1, 2, 3)),
        (2, 1, (4, 5, 6, 7)),
        (3, 1, (4, 5, 6, 7)),
    ]
    assert [(n.name, n.gpus) for n in nics] == [("mlx5_0", (0, 1)), ("mlx5_1", (2, 3))]
    # Older drivers name RDMA devices in the header and have no NUMA ID column (ALCF's Polaris table).
    old = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV4\tSYS\t24-31,56-63\t3\n"
        "GPU1\tNV4\t X \tPHB\t16-23,48-55\t2\n"
    )
    gpus, nics = nvidia.parse(old)
    assert [(g.index, g.numa) for g in gpus] == [(0, 3), (1, 2)] and nics[0].gpus == (1,)
    assert nvidia.parse("No devices were found\n") == ([], [])


def test_gpu_closest_cores_from_a_narrower_cpu_affinity(tmp_path: Path) -> None:
    """A GPU whose CPU affinity is part of its NUMA domain (as on Frontier-like nodes) gets closest_cores."""
    root = s.sys_tree(tmp_path / "sys", sockets=1, cores_per_socket=8, threads=2, numa=["0-7"])
    topo = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV4\t0-3,8-11\t0\t\tN/A\n"
        "GPU1\tNV4\t X \t0-7,8-15\t0\t\tN/A\n"
    )
    rec = _record(tmp_path / "rec", nvidia_smi_topo=topo)
    path, data = _init(tmp_path, root, rec, "--name", "n", "--scheduler", "slurm")
    assert data["node"]["gpus"] == [  # type: ignore[index]
        {"index": 0, "numa": 0, "closest_cores": "0-3"},
        {"index": 1, "numa": 0},
    ]
    _round_trip(tmp_path, path, ranks=2)


def test_rocm_slurm_pbs_flux_lsf_parsers() -> None:
    assert [g.numa for g in rocm.parse(s.ROCM_TOPONUMA)] == [3, 3, 1, 1, 0, 0, 2, 2]
    conf = slurm_facts.config(s.SCONTROL_CONFIG)
    assert conf["ClusterName"] == "gpucluster" and slurm_facts.mpi_default(conf) == "pmix"
    assert (
        slurm_facts.mpi_default({"MpiDefault": "pmix_v4"}) == "pmix"
        and slurm_facts.mpi_default({"MpiDefault": "openmpi"}) is None
    )
    parts = slurm_facts.partitions(s.SCONTROL_PARTITION)
    assert [(p.name, p.max_walltime_s, p.max_nodes, p.default) for p in parts] == [
        ("batch", 172800, 64, True),
        ("debug", 1800, 2, False),
        ("long", None, None, False),
    ]
    assert [(q.name, q.max_walltime_s, q.default) for q in slurm_facts.sinfo(s.SINFO)] == [
        ("batch", 172800, True),
        ("debug", 1800, False),
        ("long", None, False),
    ]
    queues = pbs_facts.queues(s.QSTAT_QF, pbs_facts.default_queue(s.QSTAT_BF))
    assert [(q.name, q.max_walltime_s, q.max_nodes, q.default) for q in queues] == [
        ("debug", 3600, 2, True),
        ("prod", 86400, 496, False),
        ("workq", None, None, False),
    ]
    res = flux_facts.resources(s.FLUX_RESOURCES)
    assert res is not None and (res.nodes, res.cores, res.gpus) == (2, 16, 0)
    assert flux_facts.resources("error: unknown command\n") is None
    assert lsf_facts.queue_names(s.BQUEUES) == ["priority", "normal"]


def test_hwloc_and_sysfs_parsers(tmp_path: Path) -> None:
    facts = hwloc.cpus(s.LSTOPO_XML)
    assert (facts.sockets, facts.cores_per_socket, facts.threads_per_core, facts.thread_numbering) == (
        1,
        4,
        2,
        "scatter",
    )
    with pytest.raises(ProfileError, match="not XML"):
        hwloc.cpus("<topology")
    root = s.sys_tree(
        tmp_path / "sys", sockets=2, cores_per_socket=3, threads=2, numa=["0-2", "3-5"], net={"eth0": -1}
    )
    files = sysfs.read_tree(root)
    cpus = sysfs.cpus(files)
    assert cpus is not None and cpus.numa == ((0, (0, 1, 2)), (1, (3, 4, 5)))
    assert hwloc.describe(cpus) == "2 x 3 cores x 2 threads (scatter), NUMA 0: 0-2; 1: 3-5"
    found, kind = sysfs.nics(files)
    assert [(n.name, n.numa) for n in found] == [("eth0", None)] and kind is None  # numa_node -1: unknown


def test_real_sys_matches_lscpu_view() -> None:
    """/sys as read by the parser agrees with Python's own CPU count on this machine."""
    facts = sysfs.cpus(sysfs.read_tree(Path("/sys")))
    assert facts is not None
    assert facts.sockets * facts.cores_per_socket * facts.threads_per_core == os.cpu_count()
