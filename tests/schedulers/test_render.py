"""Rendering: golden scripts for every built-in profile with its scheduler plus container, multi-step and
files-next-to-the-script variants; every script passes shellcheck; templates ship in the wheel.

Regenerate the golden files after an intended change with `HPCRING_UPDATE_GOLDEN=1 pytest tests/schedulers`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from sched_helpers import (
    GOLDEN,
    WRAPPER_REF,
    WRAPPERS,
    check_golden,
    check_shellcheck,
    cli,
    make_plan,
    render_plan,
    shellcheck,
)

from hpcring.errors import ConfigError
from hpcring.schedulers import model, plan, registry
from hpcring.schedulers.job import Step

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ("python", "train.py", "--epochs", "3")

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "frontier-slurm": ("frontier", {"nodes": 2, "account": "abc123", "command": TRAIN}),
    "summit-lsf": ("summit", {"nodes": 2, "account": "abc123", "command": TRAIN}),
    "perlmutter-gpu-slurm": ("perlmutter-gpu", {"nodes": 2, "account": "m1234_g", "command": TRAIN}),
    "generic-slurm-gpu-slurm": (
        "generic-slurm-gpu",
        {"nodes": 2, "command": TRAIN, "output": "logs/%x-%j.out"},
    ),
    "generic-lsf-lsf": ("generic-lsf", {"nodes": 2, "command": TRAIN}),
    "frontier-container": (
        "frontier",
        {
            "nodes": 1,
            "account": "abc123",
            "image": "/lustre/orion/img/train.sif",
            "binds": ("/ccs/home",),
            "command": TRAIN,
        },
    ),
    "summit-container": ("summit", {"nodes": 1, "account": "abc123", "image": "train.sif", "command": TRAIN}),
    "generic-slurm-gpu-container": (
        "generic-slurm-gpu",
        {"nodes": 2, "image": "/scratch/img/hpcring-gpu.sif", "binds": ("/scratch",), "command": TRAIN},
    ),
    "generic-lsf-container": ("generic-lsf", {"nodes": 1, "image": "hpcring-cpu.sif", "command": TRAIN}),
    "generic-slurm-gpu-steps": (
        "generic-slurm-gpu",
        {
            "nodes": 2,
            "ranks_per_node": 4,
            "gpus_per_rank": 2,
            "time_s": 1800,
            "name": "prep and train",
            "env": (("DATA", "/scratch/data set"),),
            "workdir": "/scratch/run 1",
            "steps": (
                Step(("bash", "-c", 'python prep.py --out "$DATA"'), "prepare"),
                Step(TRAIN),
                Step(("python", "eval.py")),
            ),
        },
    ),
    "generic-lsf-steps-files": (
        "generic-lsf",
        {
            "nodes": 2,
            "ranks_per_node": 4,
            "steps": (Step(("hostname",)), Step(TRAIN)),
            "modules": ("gcc/12",),
        },
    ),
}
FILES_NEXT_TO_SCRIPT = {"generic-lsf-steps-files"}


def _render(variant: str) -> tuple[plan.Plan, str]:
    name, job = VARIANTS[variant]
    options = (
        plan.RenderOptions(files_dir="/jobs", basename=variant) if variant in FILES_NEXT_TO_SCRIPT else None
    )
    p = make_plan(name, options=options, **dict(job))
    return p, render_plan(p)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden(variant: str) -> None:
    check_golden(variant, _render(variant)[1])


def test_every_golden_wrapper_is_used_and_shellcheck_clean() -> None:
    """The wrappers kept once per profile (sched_helpers.check_golden) are each named by a golden script,
    every name resolves, and each wrapper passes shellcheck as the script it is."""
    named = {
        line.removeprefix(WRAPPER_REF)
        for golden in GOLDEN.glob("*.sh")
        for line in golden.read_text().splitlines()
        if line.startswith(WRAPPER_REF)
    }
    stored = {str(p.relative_to(GOLDEN)) for p in WRAPPERS.glob("*.sh")}
    assert named == stored
    shellcheck(*WRAPPERS.glob("*.sh"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shellcheck_clean(variant: str, tmp_path: Path) -> None:
    check_shellcheck(tmp_path, _render(variant)[1])


def test_every_builtin_profile_and_local_render_shellcheck_clean(tmp_path: Path) -> None:
    for name in ("frontier", "summit", "perlmutter-gpu", "generic-slurm-gpu", "generic-lsf", "local"):
        res = cli("render", "--profile", name, "--account", "a1", "--step", "hostname", "--step", "true")
        assert res.returncode == 0, res.stderr
        check_shellcheck(tmp_path, res.stdout, f"{name}.sh")


def test_plan_numbers() -> None:
    p, _ = _render("frontier-slurm")
    flags = {d.flag: d.value for d in p.directives}
    assert flags["--nodes"] == "2" and flags["--ntasks-per-node"] == "8" and flags["--cpus-per-task"] == "7"
    assert flags["--gpus-per-task"] == "1" and flags["--core-spec"] == "8" and flags["--account"] == "abc123"
    (step,) = p.steps
    assert "--gpu-bind=closest" in step.argv and step.argv[-4:] == TRAIN
    env = dict(p.env)
    # Frontier's network block (OLCF's rccl-net-plugin page), no GPU-aware MPI unless the job asks for it.
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3" and "MPICH_GPU_SUPPORT_ENABLED" not in env
    assert "rccl-net-plugin" in p.modules and flags["--network"] == "disable_rdzv_get"
    assert p.directive_prefix == "#SBATCH" and p.submit_argv == ("sbatch", "--parsable")
    summit, text = _render("summit-lsf")
    assert {d.flag: d.value for d in summit.directives}["-alloc_flags"] == "smt4"
    assert summit.steps[0].argv[:2] == ("jsrun", "--erf_input")
    assert text.count("#BSUB -alloc_flags") == 1
    assert summit.submit_argv == ("bsub",)


def test_registry_holds_every_scheduler_and_launcher_a_profile_may_name() -> None:
    assert sorted(registry.SCHEDULERS) == sorted(model.SCHEDULERS)
    assert sorted(registry.LAUNCHERS) == sorted(model.LAUNCHERS)
    assert {n for names in model.LAUNCHERS_OF.values() for n in names} == set(model.LAUNCHERS)
    assert registry.scheduler("pbs").name == "pbs" and registry.launcher("flux").name == "flux"
    with pytest.raises(ConfigError, match=r"unknown launcher 'aprun'; allowed: .*flux.*srun"):
        registry.launcher("aprun")
    with pytest.raises(ConfigError, match=r"unknown scheduler 'sge'; allowed: .*lsf.*slurm"):
        registry.scheduler("sge")


def test_provenance_header() -> None:
    p, text = _render("summit-lsf")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert lines[1].startswith("# Generated by hpcring ")
    assert lines[2] == f"# profile: summit (sha256 {p.digest})"


def test_multi_step_script_stops_at_the_first_failing_step(tmp_path: Path) -> None:
    """Run the rendered steps with a stand-in srun that runs its command once and returns its exit code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\necho "$*" >> "$STEP_LOG"\nexec "$@"\n'
    )
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    steps = (Step(("true",)), Step(("bash", "-c", "exit 7")), Step(("touch", str(tmp_path / "never"))))
    p = make_plan("generic-slurm-gpu", nodes=1, steps=steps)
    script = tmp_path / "job.sh"
    script.write_text(render_plan(p))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STEP_LOG": str(log),
        "SLURM_JOB_NODELIST": "n1",
    }
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 7
    assert log.read_text().splitlines() == ["true", "bash -c exit 7"]
    assert not (tmp_path / "never").exists()
    assert "hpcring: step 2/3: bash -c 'exit 7'" in res.stderr


def test_render_writes_files_next_to_script(tmp_path: Path) -> None:
    out = tmp_path / "jobs" / "train.sh"
    res = cli(
        "render",
        "--profile",
        "summit",
        "--nodes",
        "2",
        "--account",
        "a",
        "-o",
        str(out),
        "--",
        "python",
        "t.py",
    )
    assert res.returncode == 0, res.stderr
    erf = out.with_suffix(".erf")
    assert erf.read_text().startswith("cpu_index_using: physical\nrank: 0: { host: 1;")
    text = out.read_text()
    assert f"HPCRING_ERF={erf}" in text and "<<'HPCRING_EOF'" not in text
    assert os.access(out, os.X_OK)
    inline = cli(
        "render",
        "--profile",
        "summit",
        "--account",
        "a",
        "--inline-files",
        "-o",
        str(tmp_path / "i.sh"),
        "--",
        "true",
    )
    assert inline.returncode == 0 and "<<'HPCRING_EOF'" in (tmp_path / "i.sh").read_text()


def test_render_job_file_and_flag_overrides(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: from-file\nnodes: 3\nranks_per_node: 2\ntime: '00:30:00'\nenv: {A: 1}\n"
        "steps:\n  - run: python prep.py\n  - run: [python, train.py]\n"
    )
    res = cli("render", "--profile", "generic-lsf", "--job", str(job), "--nodes", "2", "--env", "B=x y")
    assert res.returncode == 0, res.stderr
    assert "#BSUB -J from-file" in res.stdout and "#BSUB -n 4" in res.stdout and "#BSUB -W 0:30" in res.stdout
    assert "A=1\n" in res.stdout and "B='x y'\n" in res.stdout
    assert res.stdout.count("mpirun -n 4") == 2 and "bash -c 'python prep.py'" in res.stdout


BAD_RENDERS = [
    (["--profile", "frontier", "--", "true"], "requires an account/project: pass --account"),
    (["--profile", "frontier", "--account", "a"], "nothing to run"),
    (
        ["--profile", "perlmutter-gpu", "--account", "a", "--image", "x.sif", "--", "true"],
        "has no container runtime",
    ),
    (
        ["--profile", "frontier", "--account", "a", "--time", "3:00:00", "--", "true"],
        "exceeds the limit of 02:00:00",
    ),
    (
        ["--profile", "frontier", "--account", "a", "--time", "soon", "--", "true"],
        "--time [HPCRING_TIME]: 'soon' is not allowed; allowed: a whole number of minutes",
    ),
    (
        ["--profile", "generic-lsf", "--job-name", "a\n#BSUB -q vip", "--", "true"],
        "job name 'a\\n#BSUB -q vip' contains a newline",
    ),
    (
        ["--profile", "generic-lsf", "--job-output", "o\r.log", "--", "true"],
        "output path 'o\\r.log' contains a carriage return",
    ),
    (["--profile", "generic-lsf", "--env", "1A=2", "--", "true"], "--env '1A=2': expected KEY=VALUE"),
    (
        ["--profile", "generic-lsf", "--step", "a", "--", "true"],
        "give either a command after '--' or --step lines",
    ),
]


@pytest.mark.parametrize(("argv", "message"), BAD_RENDERS, ids=[b[1][:30] for b in BAD_RENDERS])
def test_bad_renders_exit_2_with_reason(argv: list[str], message: str) -> None:
    res = cli("render", *argv)
    assert res.returncode == 2, res.stdout
    assert message in res.stderr and "Traceback" not in res.stderr


def test_bad_job_file(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("nodes: 2\ncommand: [a]\nsteps: [{run: b}]\nranks_per_nod: 2\n")
    res = cli("render", "--profile", "generic-lsf", "--job", str(job))
    assert res.returncode == 2 and "unknown key 'ranks_per_nod'" in res.stderr


def test_directive_newline_refused_in_plan() -> None:
    with pytest.raises(ConfigError, match="contains a newline"):
        make_plan("generic-lsf", name="x\ny", command=("true",))


def test_templates_ship_in_the_wheel(tmp_path: Path) -> None:
    """Build the wheel, unpack it, and render from the unpacked copy (not the source tree)."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("hpcring-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    templates = ("slurm/job.sh.j2", "slurm/body.sh.j2", "lsf/job.sh.j2", "pbs/job.sh.j2", "flux/job.sh.j2")
    for needed in (*templates, "singularity/check.sh.j2"):
        assert f"hpcring/schedulers/templates/{needed}" in names
    assert "hpcring/schedulers/schema/profile.v1.schema.json" in names
    assert "hpcring/schedulers/profiles/frontier.yaml" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import hpcring.schedulers.jobscript as r, sys; "
        f"assert r.__file__.startswith({str(site)!r}), r.__file__; "
        f"assert r.template_roots()[0].is_relative_to({str(site)!r}); "
        "from hpcring.cli import main; "
        "sys.exit(main(['render', '--profile', 'summit', '--account', 'a', '--', 'true']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.returncode == 0, out.stderr
    assert "jsrun --erf_input" in out.stdout


@pytest.mark.parametrize(
    "name", ["frontier", "summit", "generic-slurm-gpu", "generic-lsf", "polaris", "aurora"]
)
def test_containers_doc_shows_the_rendered_container_words(name: str) -> None:
    """docs/guide/containers.md ("Hybrid MPI") quotes, per built-in profile, the exact runtime words the
    renderer emits for `--image hpcring.sif -- python train.py`, and the modules only container jobs load."""
    from hpcring.schedulers import shell

    doc = (ROOT / "docs" / "guide" / "containers.md").read_text()
    section = doc.split("\n## Hybrid MPI\n", 1)[1].split("\n## ", 1)[0]
    p = make_plan(name, nodes=1, account="a", image="hpcring.sif", command=("python", "train.py"))
    assert p.container is not None
    line = shell.join(p.container.prefix) + " python train.py"
    assert f"\n{line}\n" in section, f"docs/guide/containers.md lacks the {name} line:\n{line}"
    block = section.split(f"`{name}` (", 1)[1].split("```", 1)[0]
    assert f"{p.container.model} model" in block
    for module in p.container.modules:
        assert f"`module load {module}`" in block


def test_container_words_order_devices_env_and_job_binds(tmp_path: Path) -> None:
    """Site binds, devices, host MPI words, the job's binds, then the profile's --env values in file order
    (booleans as 1/0), extra_args, the image; host_mpi.modules are loaded only for container jobs."""
    import yaml

    from hpcring.schedulers import profile

    data = yaml.safe_load(profile.source_of("generic-slurm-gpu")[1])
    data["site"]["container"] = {
        "runtime": "apptainer",
        "binds": ["/scratch"],
        "devices": ["/dev/infiniband"],
        "env": {"FI_PROVIDER": "verbs", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "FLAG": True},
        "extra_args": ["--writable-tmpfs"],
        "host_mpi": {"abi": "openmpi", "modules": ["openmpi/4.1"], "lib_dirs": ["/opt/ompi/lib"]},
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    p = make_plan(str(path), nodes=1, image="i.sif", binds=("/data:/d",), command=("true",))
    assert p.container is not None
    assert p.container.prefix == (
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/scratch",
        "--bind",
        "/dev/infiniband",
        "--env",
        "LD_LIBRARY_PATH=/opt/ompi/lib:/.singularity.d/libs:'$LD_LIBRARY_PATH'",
        "--env",
        "MPI4PY_LIBMPI=libmpi.so.40",
        "--bind",
        "/data:/d",
        "--env",
        "FI_PROVIDER=verbs",
        "--env",
        "FLAG=1",
        "--env",
        "NCCL_IB_HCA=mlx5_0,mlx5_1",
        "--writable-tmpfs",
        "i.sif",
    )
    assert p.modules == ("openmpi/4.1",)
    assert make_plan(str(path), nodes=1, command=("true",)).modules == ()
