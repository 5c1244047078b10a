"""Each site's network stack (`site.network`) as its own documentation gives it, pinned by a golden file per
site that names the pages it comes from: the OFI plugin for NCCL/RCCL (module, library path), its batch
directive and variables, as they appear in a rendered GPU job script. GPU-aware MPI variables only on request.

Regenerate after an intended change with
`HPCRING_UPDATE_GOLDEN=1 pytest tests/schedulers/test_site_network.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sched_helpers import check_shellcheck, make_plan, render_plan

from hpcring.errors import ConfigError, JobShapeError, ProfileError
from hpcring.schedulers import mapping, planner, profile
from hpcring.schedulers.job import JobSpec, Step
from hpcring.schedulers.model import Profile
from hpcring.schedulers.plan import Plan

GOLDEN = Path(__file__).parent / "golden" / "network"
READ = "2026-11-28"
# The pages each block comes from (the profile YAML cites the same pages beside each value).
SOURCES: dict[str, tuple[str, ...]] = {
    "frontier": (
        "https://docs.olcf.ornl.gov/systems/frontier_user_guide.html (RCCL; MPICH_GPU_SUPPORT_ENABLED)",
        "https://docs.olcf.ornl.gov/software/analytics/pytorch_frontier.html (RCCL Network Plugin; "
        "Alternative Rendezvous Protocol)",
    ),
    "lumi-g": (
        "https://docs.lumi-supercomputer.eu/software/packages/pytorch/ (Multi-GPU training; Example)",
        "https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/lumig-job/ (MPI-based job)",
    ),
    "polaris": ("https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/",),
    "aurora": ("https://docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/ (Minimal set)",),
    "alps-gh200": ("https://docs.cscs.ch/software/communication/nccl/ (Using NCCL: nccl_env_vars)",),
    "perlmutter-gpu": (
        "https://docs.nersc.gov/machinelearning/launchers/ (srun): the NCCL plugin only as a Shifter",
        "  module (--image + --module=gpu,nccl-plugin); hpcring writes no Shifter jobs, so on the host",
        "  no plugin is loaded and the interconnect defaults stay",
    ),
}
ACCOUNT = {"polaris": "MyProject", "aurora": "MyProject", "alps-gh200": "g123"}


def _script(name: str, **job: object) -> str:
    return render_plan(
        make_plan(name, nodes=2, account=ACCOUNT.get(name, "abc123"), command=["./app"], **job)
    )


def _network_lines(name: str, text: str) -> list[str]:
    """The script's lines the network block makes: its directives and module loads, and the environment
    from the section's start up to hpcring's own rendezvous variables."""
    net = profile.load(name).site.network
    assert net is not None, f"{name}: no site.network"
    lines = text.splitlines()
    out = [ln for ln in lines if any(ln.endswith(" " + d) for d in net.directives)]
    out += [ln for ln in lines if ln in {f"module load {m}" for m in net.modules}]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# Environment:"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("MASTER_ADDR="))
    return out + lines[start + 1 : end]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_network_block_golden(name: str) -> None:
    """The block as rendered, against golden/network/<site>.txt, whose header names the source pages."""
    header = [f"# site.network of profile {name}, a 2-node GPU job; pages read {READ}:"]
    header += [f"#   {s}" for s in SOURCES[name]]
    text = "\n".join([*header, *_network_lines(name, _script(name))]) + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("HPCRING_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, "utf-8")
    assert text == path.read_text("utf-8"), (
        f"{path} differs (HPCRING_UPDATE_GOLDEN=1 after an intended change)"
    )


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_gpu_aware_mpi_only_on_request(name: str, tmp_path: Path) -> None:
    """No built-in profile sets MPICH_GPU_SUPPORT_ENABLED=1 by default (Cray MPICH aborts at start when the
    program does not link its GPU transfer library, and an mpi4py from pip does not); --gpu-aware-mpi sets
    it where the site documents it, and the script stays shellcheck-clean."""
    assert "export MPICH_GPU_SUPPORT_ENABLED=1" not in _script(name)
    net = profile.load(name).site.network
    assert net is not None
    if not net.gpu_aware_env:
        with pytest.raises(ConfigError, match=r"gives no GPU-aware MPI variables"):
            _script(name, gpu_aware_mpi=True)
        return
    text = _script(name, gpu_aware_mpi=True)
    assert "export MPICH_GPU_SUPPORT_ENABLED=1" in text.splitlines()
    check_shellcheck(tmp_path, text)


def test_no_gpu_aware_mpi_on_any_builtin_by_default() -> None:
    for name in profile.builtin_names():
        if name == profile.LOCAL:
            continue
        site = profile.load(name).site
        assert ("MPICH_GPU_SUPPORT_ENABLED", "1") not in site.env, name
        assert site.network is None or not site.network.gpu_aware_mpi, name


def test_cpu_job_gets_no_plugin() -> None:
    """The block is for GPU collectives: a CPU-only job on Frontier loads no plugin and asks no network
    directive (the alternative rendezvous protocol "may negatively impact MPI performance")."""
    text = render_plan(make_plan("frontier", nodes=2, gpus_per_rank=0, account="a", command=["./app"]))
    assert "rccl-net-plugin" not in text and "disable_rdzv_get" not in text
    assert "export FI_PROVIDER=cxi" in text  # the interconnect's defaults instead


def test_intel_gpus_get_no_nccl_variables() -> None:
    """Aurora's GPUs are Intel's: oneCCL's variables, no NCCL_* at all."""
    text = _script("aurora")
    assert "NCCL_" not in text and "export CCL_ATL_TRANSPORT=mpi" in text


def test_perlmutter_host_job_loads_no_plugin_and_image_names_nersc_recipe(tmp_path: Path) -> None:
    """NERSC documents its NCCL plugin only as a Shifter module (launchers page, "srun"): a GPU job on the
    host loads none and sets no NCCL_NET (NCCL refuses to start with it and no plugin), keeps the
    interconnect's defaults, stays shellcheck-clean; --image is refused with NERSC's Shifter recipe."""
    text = _script("perlmutter-gpu")
    lines = text.splitlines()
    assert not [ln for ln in lines if ln.startswith("export NCCL_NET=") or "nccl-plugin" in ln]
    for var in ("FI_PROVIDER=cxi", "NCCL_SOCKET_IFNAME=hsn", "NCCL_NET_GDR_LEVEL=PHB", "NCCL_CROSS_NIC=1"):
        assert f"export {var}" in lines, var
    check_shellcheck(tmp_path, text)
    with pytest.raises(ConfigError, match=r"has no container runtime: NERSC runs images with Shifter") as e:
        make_plan("perlmutter-gpu", nodes=2, account="a", image="x.sif", command=["./app"])
    assert "#SBATCH --module=gpu,nccl-plugin" in str(e.value)
    assert "https://docs.nersc.gov/machinelearning/launchers/" in str(e.value)


def test_frontier_extended_partition() -> None:
    """frontier_user_guide.html, "extended Partition (queue) Policy": 24-hour and 64-node maxima."""
    p = make_plan(
        "frontier", nodes=64, time_s=24 * 3600, partition="extended", account="a", command=["./app"]
    )
    assert ("--partition", "extended") in {(d.flag, d.value) for d in p.directives}
    with pytest.raises(JobShapeError, match=r"extended"):
        make_plan("frontier", nodes=65, partition="extended", account="a", command=["./app"])


def test_summit_is_retired(tmp_path: Path) -> None:
    """OLCF: Summit "was decommissioned on November 15, 2024": marked in `profiles list`, and a script for it
    says so in a WARNING line (shellcheck-clean) and on stderr."""
    p = profile.load("summit")
    assert p.retired is not None and p.retired.date == "2024-11-15"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    listing = subprocess.run(
        [sys.executable, "-m", "hpcring", "profiles", "list"], capture_output=True, text=True, env=env
    )
    assert listing.returncode == 0, listing.stderr
    (line,) = [ln for ln in listing.stdout.splitlines() if ln.startswith("summit ")]
    assert line.endswith("[retired 2024-11-15]")
    res = subprocess.run(
        [sys.executable, "-m", "hpcring", "render", "--profile", "summit", "--account", "a", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "warning: profile 'summit' describes a retired system" in res.stderr
    assert "# WARNING: profile 'summit' describes a retired system" in res.stdout
    check_shellcheck(tmp_path, res.stdout)
    assert profile.load("frontier").retired is None


def test_container_engine_refuses_sif_with_the_fix() -> None:
    """CSCS's EDF takes "a remote Docker/OCI registry or a local Squashfs file" (edf.md), not a .sif."""
    with pytest.raises(ConfigError, match=r"registry reference.*enroot import"):
        make_plan("alps-gh200", nodes=1, account="g", image="/scratch/train.sif", command=["./app"])
    ok = make_plan("alps-gh200", nodes=1, account="g", image="/scratch/train.sqsh", command=["./app"])
    assert ok.container is not None and ok.container.edf is not None
    assert 'image = "/scratch/train.sqsh"' in ok.container.edf


def _with_network(block: str) -> str:
    """Frontier's profile with its network block replaced by `block` (YAML, indented for site:)."""
    text = profile.source_of("frontier")[1]
    head, rest = text.split("  network:\n", 1)
    tail = rest[rest.index("\n  smt:") :]
    return head + block + tail


def test_hostile_network_values_stay_quoted(tmp_path: Path) -> None:
    """A profile's network variables reach the script single-quoted (shellcheck-clean, nothing expanded);
    a library path that is not a path is refused naming the field."""
    evil = "x'; touch /tmp/pwned; echo '$(id)`uname`"
    text = _with_network(f'  network:\n    env:\n      NCCL_DEBUG: "{evil}"\n')
    p = profile.parse(text, "evil.yaml")
    rm_text = render_plan(make_plan_from(p))
    check_shellcheck(tmp_path, rm_text)
    assert "export NCCL_DEBUG='x'\"'\"'; touch /tmp/pwned; echo '\"'\"'$(id)`uname`'" in rm_text
    bad = _with_network('  network:\n    library_paths: ["lib; rm -rf /"]\n')
    with pytest.raises(ProfileError, match=r"site.network.library_paths: .* is not a host path"):
        profile.parse(bad, "bad.yaml")
    unknown = _with_network("  network:\n    plugins: [x]\n")
    with pytest.raises(ProfileError, match=r"site.network"):
        profile.parse(unknown, "unknown.yaml")


def make_plan_from(p: Profile) -> Plan:
    spec = JobSpec(nodes=1, account="a", steps=(Step(("./app",)),))
    return planner.build(mapping.build(p, spec), spec)


@pytest.mark.parametrize("inherited", [None, "", "/usr/lib/x"])
def test_library_paths_run_under_set_u(inherited: str | None) -> None:
    """Polaris's plugin directories go first on LD_LIBRARY_PATH, the inherited value (if any) after them,
    and the line works under the script's `set -euo pipefail` with the variable unset."""
    lines = _network_lines("polaris", _script("polaris"))
    body = "\n".join(ln for ln in lines if "LD_LIBRARY_PATH" in ln)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if inherited is not None:
        env["LD_LIBRARY_PATH"] = inherited
    res = subprocess.run(
        ["bash", "-c", f'set -euo pipefail\n{body}\nprintf "%s" "$LD_LIBRARY_PATH"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    plugin = "/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib/"
    assert res.stdout == (plugin + ":" + inherited if inherited else plugin)


def test_block_checks_name_the_field() -> None:
    """What a schema cannot say: GPU-aware MPI enabled with nothing to set, LD_LIBRARY_PATH outside
    library_paths, and a network block on Kubernetes (no batch script to put it in)."""
    cases = {
        "  network:\n    gpu_aware_mpi:\n      enabled: true\n": r"enabled: true, but .* sets nothing",
        "  network:\n    env:\n      LD_LIBRARY_PATH: /x\n": r"env.LD_LIBRARY_PATH: give the directories in",
    }
    for block, message in cases.items():
        with pytest.raises(ProfileError, match=message):
            profile.parse(_with_network(block), "x.yaml")
    k8s = profile.source_of("generic-k8s-gpu")[1].replace(
        "\nsite:\n", "\nsite:\n  network:\n    env: {A: b}\n", 1
    )
    with pytest.raises(ProfileError, match=r"site.network: the network block goes into batch scripts"):
        profile.parse(k8s, "k8s.yaml")


def test_a_site_may_enable_gpu_aware_mpi_and_a_job_turn_it_off() -> None:
    """A site whose mpi4py is built against Cray MPICH with GTL enables it in its copy of the profile; a job
    that knows better says --no-gpu-aware-mpi (gpu_aware_mpi: false)."""
    text = _with_network(
        "  network:\n    gpu_aware_mpi:\n      enabled: true\n      env: {MPICH_GPU_SUPPORT_ENABLED: 1}\n"
    )
    p = profile.parse(text, "site-copy.yaml")
    for requested, expected in ((None, True), (False, False), (True, True)):
        spec = JobSpec(nodes=1, account="a", steps=(Step(("./app",)),), gpu_aware_mpi=requested)
        env = dict(planner.build(mapping.build(p, spec), spec).env)
        assert (env.get("MPICH_GPU_SUPPORT_ENABLED") == "1") is expected, requested
