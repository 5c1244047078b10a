"""Profiles: built-ins validate, the published schema is the shipped one, and bad profiles fail with the YAML
path, the bad value and the allowed values (through the CLI: exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sched_helpers import cli

from hpcring.errors import ProfileError
from hpcring.schedulers import local, profile, validation

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = [
    "frontier",
    "summit",
    "perlmutter-gpu",
    "generic-slurm-gpu",
    "generic-lsf",
    "generic-pbs",
    "generic-flux",
    "generic-k8s-gpu",
    "lumi-g",
    "lumi-c",
    "polaris",
    "aurora",
    "alps-gh200",
    "tuolumne",
    "el-capitan",
]


def builtin_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(profile.source_of(name)[1])
    return data


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_profiles_validate_and_cite_sources(name: str) -> None:
    p = profile.load(name)
    assert p.name == name
    text = p.source
    assert "yaml-language-server: $schema=" in text
    if not name.startswith("generic"):
        assert "https://" in text  # every site profile cites its documentation


def test_builtin_list_matches_files() -> None:
    assert profile.builtin_names() == [*sorted(BUILTIN), "local"]


def test_frontier_facts() -> None:
    n = profile.load("frontier").node
    assert (n.sockets, n.cores_per_socket, n.threads_per_core) == (1, 64, 2)
    assert n.hw_threads(5) == (5, 69)
    assert sorted(n.reserved_cores) == list(range(0, 64, 8))
    assert len(n.usable_cores) == 56
    by_numa = {g.index: g.numa for g in n.gpus}
    assert by_numa == {0: 3, 1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 2, 7: 2}
    assert n.gpus[0].closest_cores == tuple(range(49, 56))
    assert [nic.name for nic in n.nics] == ["hsn0", "hsn1", "hsn2", "hsn3"]


def test_summit_facts() -> None:
    p = profile.load("summit")
    n = p.node
    assert (n.sockets, n.cores_per_socket, n.threads_per_core) == (2, 22, 4)
    assert n.hw_threads(0) == (0, 1, 2, 3)
    assert n.hw_threads(22)[0] == 88  # socket 1 starts at hardware thread 88
    assert len(n.usable_cores) == 42
    assert [g.numa for g in n.gpus] == [0, 0, 0, 1, 1, 1]
    assert (p.site.scheduler, p.site.launcher) == ("lsf", "jsrun")


def test_perlmutter_facts() -> None:
    p = profile.load("perlmutter-gpu")
    assert [g.numa for g in p.node.gpus] == [3, 2, 1, 0]
    assert p.node.gpu_visibility == "shared"
    assert p.site.slurm.constraint == "gpu"


def test_published_schema_is_the_shipped_one() -> None:
    for name in ("profile", "job"):
        for version in validation.versions(name):
            published = json.loads((ROOT / "schemas" / f"{name}.v{version}.schema.json").read_text())
            assert published == validation.load_schema(name, version)
    assert validation.versions("profile") == (1, 2)


def _mutate(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set `a.b[2].c` in a deep copy of data (value `...` deletes the key)."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    parts = path.replace("[", ".").replace("]", "").split(".")
    cur: Any = out
    for p in parts[:-1]:
        cur = cur[int(p)] if p.isdigit() else cur[p]
    last = parts[-1]
    if value is ...:
        del cur[last]
    elif last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return out


BAD = [
    ("site.scheduler", "pbs", ["site.scheduler", "'pbs'", "'slurm' or 'lsf'"]),
    ("site.launcher", "aprun", ["site.launcher", "'aprun'", "'srun', 'jsrun' or 'mpirun'"]),
    (
        "node.interconnect",
        "myrinet",
        ["node.interconnect", "'myrinet'", "'infiniband', 'roce', 'slingshot' or"],
    ),
    ("node.gpu_visibility", "all", ["node.gpu_visibility", "'isolated' or 'shared'"]),
    ("node.gpus[2].numa", 7, ["node.gpus[2].numa", "NUMA domain 7 does not exist", "allowed: 0, 1, 2 or 3"]),
    ("node.gpus[0].closest_cores", "1-7", ["node.gpus[0].closest_cores", "core 1", "NUMA domain 3"]),
    ("node.gpus[0].index", 1, ["node.gpus", "index values must be unique"]),
    ("node.reserved_cores", "0-70", ["node.reserved_cores", "core 64 does not exist", "allowed: 0-63"]),
    ("node.numa[1].cores", "16-32", ["node.numa[2].cores", "core 32 is already in NUMA domain 1"]),
    ("node.numa[3].cores", "48-62", ["node.numa", "cores 63 are in no NUMA domain"]),
    ("node.threads_per_core", 9, ["node.threads_per_core", "9"]),
    ("node.sockets", "one", ["node.sockets", "'one' has the wrong type", "'integer'"]),
    ("node.cores", 64, ["(top level)" if False else "node", "unknown key 'cores'", "allowed keys:"]),
    ("site.smt", 4, ["site.smt", "4 exceeds node.threads_per_core (2)"]),
    ("site.partitions[0].max_walltime", "12h", ["site.partitions[0].max_walltime", "'12h'", "allowed"]),
    (
        "site.partitions[0].selector",
        "queue",
        ["site.partitions[0].selector", "'queue'", "'partition' or 'qos'"],
    ),
    (
        "site.container.runtime",
        "docker",
        ["site.container.runtime", "'docker'", "'singularity' or 'apptainer'"],
    ),
    ("site.slurm.gpu_bind", "nearest", ["site.slurm.gpu_bind", "'map', 'closest' or 'none'"]),
    ("schema_version", 3, ["schema_version", "3 is not allowed", "allowed: 1 or 2"]),
    ("node", ..., ["(top level)", "missing 'node'"]),
]


def _refused(path: str, value: Any, expected: list[str]) -> None:
    """Frontier's profile with `value` at `path` is refused with a message naming the file and each piece."""
    data = _mutate(builtin_data("frontier"), path, value)
    with pytest.raises(ProfileError) as info:
        profile.parse(yaml.safe_dump(data), "bad.yaml")
    msg = str(info.value)
    assert msg.startswith("bad.yaml: ")
    for piece in expected:
        assert piece in msg, (piece, msg)


@pytest.mark.parametrize(("path", "value", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_profile_messages(path: str, value: Any, expected: list[str]) -> None:
    _refused(path, value, expected)


def test_cross_field_launcher_scheduler() -> None:
    data = _mutate(builtin_data("summit"), "site.launcher", "srun")
    with pytest.raises(
        ProfileError, match=r"site.launcher: 'srun' cannot launch under lsf; allowed: 'jsrun' or"
    ):
        profile.parse(yaml.safe_dump(data), "x")


def test_walltime_bins_must_be_sorted() -> None:
    data = _mutate(builtin_data("frontier"), "site.partitions[0].walltime_bins[0].max_nodes", 5000)
    with pytest.raises(ProfileError, match=r"walltime_bins: bins must be sorted by max_nodes"):
        profile.parse(yaml.safe_dump(data), "x")


def test_cli_validate_bad_file_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutate(builtin_data("frontier"), "node.gpus[2].numa", 9)))
    res = cli("profiles", "validate", str(bad))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "node.gpus[2].numa: NUMA domain 9 does not exist; allowed: 0, 1, 2 or 3" in res.stderr
    good = tmp_path / "good.yaml"
    good.write_text(profile.source_of("summit")[1])
    ok = cli("profiles", "validate", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "valid profile 'summit': 2 x 22 cores x 4 threads, 2 reserved, 6 GPU(s), lsf/jsrun" in ok.stdout


def test_cli_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("node: [unclosed\n")
    res = cli("profiles", "validate", str(bad))
    assert res.returncode == 2 and "not valid YAML" in res.stderr and "Traceback" not in res.stderr


def test_cli_list_show_schema() -> None:
    res = cli("profiles", "list")
    assert res.returncode == 0
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert names == [*sorted(BUILTIN), "local"]
    show = cli("profiles", "show", "frontier")
    assert show.stdout == profile.source_of("frontier")[1]
    schema = cli("profiles", "schema")
    assert json.loads(schema.stdout) == validation.load_schema("profile", 2)
    for version in (1, 2):
        old = cli("profiles", "schema", "--schema-version", str(version))
        assert json.loads(old.stdout) == validation.load_schema("profile", version)
    env = cli("profiles", "schema", env={"HPCRING_SCHEMA_VERSION": "1"})
    assert json.loads(env.stdout) == validation.load_schema("profile", 1)
    bad = cli("profiles", "schema", "--schema-version", "7")
    assert bad.returncode == 2 and "allowed: 1 or 2" in bad.stderr and "Traceback" not in bad.stderr
    job = cli("profiles", "schema", "--job")
    assert json.loads(job.stdout) == validation.load_schema("job", 1)
    unknown = cli("profiles", "show", "nosuch")
    assert (
        unknown.returncode == 2
        and "unknown profile 'nosuch'; built-in profiles: 'alps-gh200', 'aurora'," in unknown.stderr
    )


def test_profile_search_path(tmp_path: Path) -> None:
    data = _mutate(builtin_data("generic-lsf"), "name", "mysite")
    (tmp_path / "mysite.yaml").write_text(yaml.safe_dump(data))
    res = cli("map", "--profile", "mysite", "--format", "json", env={"HPCRING_PROFILE_PATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == 2


def test_local_profile_matches_this_machine() -> None:
    import os

    p = profile.load("local")
    n = p.node
    online = len(local.cpu_topology())
    assert n.cores * n.threads_per_core == online
    all_threads = sorted(t for c in range(n.cores) for t in n.hw_threads(c))
    assert all_threads == sorted(local.cpu_topology())
    assert len(all_threads) <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # 2 sockets x 2 cores x 2 threads, Linux x86 style (thread t of core c is c + t*4)
        (
            {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)},
            {"sockets": 2, "cores_per_socket": 2, "threads_per_core": 2, "thread_numbering": "scatter"},
        ),
        # POWER style: 4 consecutive threads per core
        (
            {i: (0, i // 4) for i in range(8)},
            {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 4, "thread_numbering": "compact"},
        ),
    ],
)
def test_describe_cpus(table: dict[int, tuple[int, int]], expected: dict[str, Any]) -> None:
    assert local.describe_cpus(table) == expected


def test_describe_cpus_refuses_irregular_numbering() -> None:
    with pytest.raises(ProfileError, match="neither compact nor scatter"):
        local.describe_cpus({0: (0, 0), 1: (0, 1), 2: (0, 1), 3: (0, 0)})


HM = "site.container.host_mpi"
# (id, YAML path, value, fragments of the message): schema errors first, then the code's cross-field checks.
BAD_CONTAINER = [
    ("abi", f"{HM}.abi", "mvapich", [f"{HM}.abi", "'mvapich' is not allowed", "'mpich' or 'openmpi'"]),
    ("no-abi", f"{HM}.abi", ..., [HM, "missing 'abi'"]),
    ("unknown-key", f"{HM}.prefix", "/opt", [HM, "unknown key 'prefix'", "'abi', 'binds'"]),
    ("repeated-bind", f"{HM}.binds", ["/opt/cray", "/opt/cray"], [f"{HM}.binds", "more than once"]),
    ("device-not-dev", "site.container.devices", ["/tmp/ib"], ["site.container.devices[0]", "'^/dev/'"]),
    ("device-dotdot", "site.container.devices", ["/dev/../etc"], ["devices[0]", "not a plain device path"]),
    ("env-name", "site.container.env", {"1X": "a"}, ["site.container.env", "'1X'"]),
    ("relative-lib-dir", f"{HM}.lib_dirs", ["lib64"], [f"{HM}.lib_dirs[0]", "'lib64' is relative"]),
    ("colon-in-bind", f"{HM}.binds", ["/opt/a:/b"], [f"{HM}.binds[0]", "not a host path", "':' and ','"]),
    ("comma-in-lib", f"{HM}.libs", ["/usr/lib64/a,b.so"], [f"{HM}.libs[0]", "not a host path"]),
    ("shell-in-bind", f"{HM}.binds", ["/opt/$(id)"], [f"{HM}.binds[0]", "'/opt/$(id)' is not a host path"]),
    ("bad-ref", f"{HM}.lib_dirs", ["${9X}/lib"], [f"{HM}.lib_dirs[0]", "not a host path"]),
    (
        "lib-name-ref",
        f"{HM}.libs",
        ["/usr/lib64/${LIB}"],
        [f"{HM}.libs[0]", "must end in a literal file name"],
    ),
    (
        "lib-name-twice",
        f"{HM}.libs",
        ["/usr/lib64/libcxi.so.1", "/opt/lib/libcxi.so.1"],
        [f"{HM}.libs", "'libcxi.so.1' appears twice", "/opt/hpcring/host-libs"],
    ),
    (
        "abi-vs-site-mpi",
        f"{HM}.abi",
        "openmpi",
        [f"{HM}.abi", "'openmpi' does not fit site.mpi 'cray-mpich'", "provided by 'openmpi'"],
    ),
    (
        "env-equals",
        "site.container.env",
        {"FI_CXI_OPT": "a=b"},
        ["site.container.env.FI_CXI_OPT", "contains '='", "--env values may not contain"],
    ),
    (
        "env-owned-by-host-mpi",
        "site.container.env",
        {"LD_PRELOAD": "/x.so"},
        ["site.container.env.LD_PRELOAD", "set by site.container.host_mpi"],
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "expected"), [b[1:] for b in BAD_CONTAINER], ids=[b[0] for b in BAD_CONTAINER]
)
def test_bad_container_messages(path: str, value: Any, expected: list[str]) -> None:
    _refused(path, value, expected)


def test_spectrum_mpi_has_no_abi_family() -> None:
    data = _mutate(builtin_data("summit"), "site.container.host_mpi", {"abi": "openmpi"})
    with pytest.raises(ProfileError, match=r"Spectrum MPI ships libmpi_ibm.so, ABI-compatible with neither"):
        profile.parse(yaml.safe_dump(data), "x")


def test_container_sections_are_optional_and_old_profiles_stay_valid() -> None:
    """Schema v1 only gained optional keys: a container with just a runtime is still a valid profile."""
    data = _mutate(builtin_data("frontier"), "site.container", {"runtime": "apptainer"})
    c = profile.parse(yaml.safe_dump(data), "x").site.container
    assert c is not None and (c.binds, c.devices, c.env, c.host_mpi) == ((), (), (), None)


def test_frontier_host_mpi_follows_olcf() -> None:
    """The OLCF example's bind path, container libraries and library path, as the profile states them."""
    c = profile.load("frontier").site.container
    assert c is not None and c.host_mpi is not None
    m = c.host_mpi
    assert (m.abi, m.soname, m.modules) == ("mpich", "libmpi.so.12", ("cray-mpich-abi",))
    assert m.binds == ("/usr/share/libdrm", "/var/spool/slurmd", "/opt/cray")
    assert "/usr/lib64/libcxi.so.1" in m.libs and m.lib_dirs[0] == "${CRAY_MPICH_ROOTDIR}/gtl/lib"
    assert m.preload == ("${CRAY_MPICH_ROOTDIR}/gtl/lib/libmpi_gtl_hsa.so.0",)
    for name in ("summit", "generic-slurm-gpu"):
        other = profile.load(name).site.container
        assert other is not None and other.devices == ("/dev/infiniband",) and other.host_mpi is None
