"""PBS Pro: golden scripts (hydra and PALS mpiexec, with and without a container), shellcheck, the numbers of
the Plan, the per-rank binding the launch line gives when run through a stand-in mpiexec of each dialect, the
GPU wrapper, and `hpcring submit` with stand-in qsub/qstat (dry run, exit codes, a job that vanishes).

Regenerate the golden files after an intended change with `HPCRING_UPDATE_GOLDEN=1 pytest
tests/schedulers/test_pbs.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pbs_flux_helpers import (
    PROBE,
    TRAIN,
    calls,
    derived_profile,
    probes,
    run_rendered,
    tools_env,
)
from sched_helpers import check_golden, check_shellcheck, cli, make_plan, render_plan

from hpcring.cli.job_flags import NOT_WRITTEN
from hpcring.errors import ProfileError
from hpcring.schedulers import mapping, pbs_batch, pbs_jobs, profile
from hpcring.schedulers.job import JobSpec, Step
from hpcring.schedulers.launchers import mpiexec_affinity

PALS = {"mpi": "cray-mpich", "pbs": {"mpiexec": "pals", "filesystems": ["home", "eagle"], "keep": "doe"}}


def _variant(name: str, tmp: Path) -> dict[str, Any]:
    return {
        "generic-pbs-pbs": {"profile": "generic-pbs", "nodes": 2, "command": TRAIN, "account": "proj1"},
        "generic-pbs-container": {
            "profile": "generic-pbs",
            "nodes": 2,
            "image": "/scratch/img/hpcring-gpu.sif",
            "binds": ("/scratch",),
            "command": TRAIN,
        },
        "generic-pbs-pals": {
            "profile": derived_profile(tmp, "generic-pbs", **PALS),
            "nodes": 2,
            "command": TRAIN,
            "partition": "workq",
            "output": "logs/train.out",
        },
    }[name]


@pytest.mark.parametrize("variant", ["generic-pbs-pbs", "generic-pbs-container", "generic-pbs-pals"])
def test_golden_and_shellcheck(variant: str, tmp_path: Path) -> None:
    job = _variant(variant, tmp_path)
    text = render_plan(make_plan(job.pop("profile"), **job))
    if variant == "generic-pbs-pals":  # the derived profile's path and digest vary with tmp_path
        text = "\n".join(line for line in text.splitlines() if not line.startswith("# profile:")) + "\n"
    check_golden(variant, text)
    check_shellcheck(tmp_path, text)


def test_plan_numbers_hydra() -> None:
    p = make_plan("generic-pbs", nodes=2, command=TRAIN, account="proj1", time_s=5400)
    d = [(x.flag, x.value) for x in p.directives]
    assert d[:4] == [
        ("-N", "hpcring"),
        ("-l", "select=2:ncpus=64:ngpus=4"),
        ("-l", "place=scatter"),
        ("-l", "walltime=01:30:00"),
    ]
    assert ("-A", "proj1") in d and ("-q", "workq") in d and ("-k", "doe") in d and ("-j", "oe") in d
    (step,) = p.steps
    bind = "user:" + ",".join("+".join(map(str, range(8 * i, 8 * i + 8))) for i in range(4))
    assert step.argv[:7] == ("mpiexec", "-n", "8", "-ppn", "4", "-bind-to", bind)
    assert step.argv[7:9] == ("bash", '"$HPCRING_AFFINITY"') and step.argv[9:] == TRAIN
    assert p.submit_argv == ("qsub",) and p.directive_prefix == "#PBS"


def test_plan_numbers_pals(tmp_path: Path) -> None:
    path = derived_profile(tmp_path, "generic-pbs", **PALS)
    p = make_plan(path, nodes=3, ranks_per_node=2, gpus_per_rank=2, cpus_per_rank=4, command=("true",))
    d = [(x.flag, x.value) for x in p.directives]
    assert ("-l", "filesystems=home:eagle") in d and ("-l", "select=3:ncpus=64:ngpus=4") in d
    (step,) = p.steps
    assert step.argv[:9] == (
        "mpiexec",
        "-n",
        "6",
        "--ppn",
        "2",
        "--depth",
        "4",
        "--cpu-bind",
        "list:0-3:16-19",
    )
    wrapper = p.files[0]
    assert wrapper.var == "HPCRING_AFFINITY" and "  0) devices=0,1 ;;" in wrapper.content
    assert "  1) devices=2,3 ;;" in wrapper.content and "  2)" not in wrapper.content


def test_pals_needs_cray_mpich(tmp_path: Path) -> None:
    path = derived_profile(tmp_path, "generic-pbs", mpi="openmpi", pbs={"mpiexec": "pals"})
    with pytest.raises(
        ProfileError, match=r"site\.pbs\.mpiexec: 'pals' starts Cray MPICH ranks.*allowed with"
    ):
        profile.load(path)


@pytest.mark.parametrize(
    ("name", "expected"), [("it's a job", "it_s_a_job"), ("-x", "x"), ("", "job"), ("ü", "job")]
)
def test_job_name_for_qsub(name: str, expected: str) -> None:
    assert pbs_batch.job_name(name) == expected
    assert pbs_batch.job_name("a" * 300) == "a" * 236


@pytest.mark.parametrize("dialect", ["hydra", "pals"])
@pytest.mark.parametrize(("nodes", "rpn", "gpr"), [(1, 1, 1), (2, 2, 2), (2, 4, 1)])
def test_launch_line_binding_through_standin_mpiexec(
    dialect: str, nodes: int, rpn: int, gpr: int, tmp_path: Path
) -> None:
    """Run the rendered script (the wrapper included) with the stand-in mpiexec: every rank lands on the host,
    CPUs and GPUs the RankMap gives it."""
    site = PALS if dialect == "pals" else {}
    path = derived_profile(tmp_path, "generic-pbs", **site)
    spec = JobSpec(nodes=nodes, ranks_per_node=rpn, gpus_per_rank=gpr, steps=(Step(PROBE),))
    rm = mapping.build(profile.load(path), spec)
    text = render_plan(make_plan(path, nodes=nodes, ranks_per_node=rpn, gpus_per_rank=gpr, command=PROBE))
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"host{n}\n" for n in range(nodes)))
    env = tools_env(tmp_path, PBS_NODEFILE=str(nodefile), PBS_JOBID="7.pbs", PBS_O_WORKDIR=str(tmp_path))
    res = run_rendered(tmp_path, text, env)
    assert res.returncode == 0, res.stderr
    got = sorted(probes(res.stdout), key=lambda r: int(r["PMI_RANK"]))
    expected = [
        {
            "STANDIN_HOST": f"host{r.node}",
            "PMI_RANK": str(r.rank),
            "FLUX_TASK_RANK": None,
            "STANDIN_CPUS": ",".join(map(str, r.slot.cpus)),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, r.slot.gpus)),
        }
        for r in rm.ranks()
    ]
    assert got == expected
    (call,) = [c for c in calls(env) if c["tool"] == "mpiexec"]
    assert ("--cpu-bind" in call["argv"]) == (dialect == "pals") and call["argv"][-len(PROBE) :] == list(
        PROBE
    )


def test_wrapper_refuses_a_rank_it_cannot_place(tmp_path: Path) -> None:
    p = make_plan("generic-pbs", nodes=1, command=("true",))
    wrapper = tmp_path / "affinity.sh"
    wrapper.write_text(p.files[0].content)
    check_shellcheck(tmp_path, p.files[0].content, "affinity.sh")
    for env in ({}, {"PALS_LOCAL_RANKID": "4"}):
        res = subprocess.run(
            ["bash", str(wrapper), "true"], capture_output=True, text=True, env=env, timeout=30
        )
        assert res.returncode == 2 and "hpcring: no GPU for this rank" in res.stderr
    res = subprocess.run(
        ["bash", str(wrapper), "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'],
        capture_output=True,
        text=True,
        env={"PMI_LOCAL_RANK": "3", "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert res.stdout == "3\n"


def test_wrapper_variable_per_vendor(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load(profile.source_of("generic-pbs")[1])
    data["node"]["gpu_vendor"] = "amd"
    path = tmp_path / "amd.yaml"
    path.write_text(yaml.safe_dump(data))
    p = make_plan(str(path), nodes=1, command=("true",))
    assert 'export ROCR_VISIBLE_DEVICES="$devices"' in p.files[0].content
    assert mpiexec_affinity.VISIBLE_DEVICES["intel"] == "ZE_AFFINITY_MASK"


def test_no_wrapper_without_gpus_and_shared_visibility(tmp_path: Path) -> None:
    assert make_plan("generic-pbs", nodes=1, gpus_per_rank=0, ranks_per_node=2, command=("true",)).files == ()
    import yaml

    data = yaml.safe_load(profile.source_of("generic-pbs")[1])
    data["node"]["gpu_visibility"] = "shared"
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(data))
    p = make_plan(str(path), nodes=1, command=("true",))
    assert p.files == () and dict(p.env)["HPCRING_RANK_GPUS"] == "0|1|2|3"


# --- submit -------------------------------------------------------------------------------------------------


def _submit(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "submit", "--profile", "generic-pbs", "--nodes", "2", "--ranks-per-node", "2", "--poll", "0.1",
        "--script-dir", str(tmp_path / "jobs"), *args, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(("step", "code"), [("true", 0), ("exit 3", 3)])
def test_submit_wait_returns_the_job_exit_code(step: str, code: int, tmp_path: Path) -> None:
    env = tools_env(tmp_path)
    res = _submit(tmp_path, env, "--wait", "--step", step)
    assert res.returncode == code, res.stderr
    assert res.stdout.splitlines() == ["1234.pbs-standin"]
    assert f"job 1234.pbs-standin ended: F, exit code {code}" in res.stderr
    (script,) = (tmp_path / "jobs").glob("hpcring-*.sh")
    tools = [(c["tool"], c["argv"]) for c in calls(env)]
    assert tools[0] == ("qsub", [str(script)])
    assert ("qstat", ["-x", "-f", "-F", "json", "1234.pbs-standin"]) in tools
    assert [t for t, _ in tools].count("mpiexec") == 1
    # The job ran where qsub was called (PBS_O_WORKDIR), its output joined in NAME.oSEQ there.
    assert (tmp_path / "hpcring.o1234").exists()


def test_submit_wait_text_qstat_and_vanishing_job(tmp_path: Path) -> None:
    env = tools_env(tmp_path, STANDIN_QSTAT_NO_JSON="1")
    res = _submit(tmp_path, env, "--wait", "--step", "exit 4")
    assert res.returncode == 4, res.stderr
    assert ("qstat", ["-x", "-f", "1234.pbs-standin"]) in [(c["tool"], c["argv"]) for c in calls(env)]
    gone = tools_env(tmp_path / "gone", STANDIN_PBS_HISTORY="0")
    res = _submit(tmp_path / "gone", gone, "--wait", "--step", "sleep 0.5")
    assert res.returncode == 1
    assert "job 1234.pbs-standin left the PBS queue without a recorded exit status" in res.stderr
    assert "Unknown Job Id 1234.pbs-standin" in res.stderr and "Traceback" not in res.stderr


def test_submit_dry_run_prints_exactly_what_would_run(tmp_path: Path) -> None:
    env = tools_env(tmp_path)
    out = tmp_path / "jobs" / "train.sh"
    res = _submit(tmp_path, env, "--dry-run", "-o", str(out), "--", "python", "t.py")
    assert res.returncode == 0, res.stderr
    rendered = cli(
        "render", "--profile", "generic-pbs", "--nodes", "2", "--ranks-per-node", "2", "-o", str(out),
        "--", "python", "t.py", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert rendered.returncode == 0
    script = out.read_text()
    affinity = (tmp_path / "jobs" / "train.affinity").read_text()
    assert res.stdout == (
        f"# script: {out} {NOT_WRITTEN}\n{script}# file: {tmp_path / 'jobs' / 'train.affinity'}\n{affinity}"
        f"# would run: qsub {out}\n"
    )
    assert calls(env) == []


def test_submit_refused(tmp_path: Path) -> None:
    env = tools_env(tmp_path, STANDIN_QSUB_REFUSE="Unauthorized Request")
    res = _submit(tmp_path, env, "--", "true")
    assert res.returncode == 1 and "qsub refused the job (exit 1): qsub: Unauthorized Request" in res.stderr


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [
        (
            "1234.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\n",
            "1234.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
        ),
        ("77[].server\n", "77[].server"),
        ("99\n", "99"),
        ("qsub: warning\n5.s\n", "5.s"),
        ("nothing\n", None),
    ],
)
def test_job_id_parsing(stdout: str, job_id: str | None) -> None:
    assert pbs_jobs.job_id(stdout) == job_id


@pytest.mark.parametrize(("status", "code"), [(0, 0), (3, 3), (137, 137), (265, 137), (271, 143), (-1, 1)])
def test_exit_status_to_exit_code(status: int, code: int) -> None:
    assert pbs_jobs.exit_code(status) == code


def test_tiles_select_gpu_tile_pairs(tmp_path: Path) -> None:
    """Where the RankMap gives GPU tiles (Aurora's Intel Max), the wrapper sets FLAT mode and each rank's
    entry is its tiles' FLAT device numbers (2 * gpu + tile) in ZE_AFFINITY_MASK, and a chunk that asks for
    GPUs asks for the physical ones (Aurora itself asks for whole nodes by `system=aurora`, as ALCF
    documents)."""
    p = make_plan("aurora", nodes=1, account="a", command=("true",))
    rm = mapping.build(profile.load("aurora"), JobSpec(nodes=1, account="a", steps=(Step(("true",)),)))
    content = p.files[0].content
    assert 'export ZE_AFFINITY_MASK="$devices"' in content
    for slot in rm.slots(0):
        flat = ",".join(str(2 * d + t) for d, t in slot.tiles)
        assert f"  {slot.local_rank}) devices={flat} ;;" in content
    assert "export ZE_FLAT_DEVICE_HIERARCHY=FLAT" in content.splitlines()
    devices = {g.device for g in profile.load("aurora").node.gpus}
    path = derived_profile(tmp_path, "aurora", pbs={"filesystems": ["flare"]})
    p = make_plan(path, nodes=1, account="a", command=("true",))
    assert ("-l", f"select=1:ncpus=208:ngpus={len(devices)}") in [(d.flag, d.value) for d in p.directives]


def test_map_format_mpiexec() -> None:
    res = cli("map", "--profile", "generic-pbs", "--nodes", "2", "--format", "mpiexec")
    assert res.returncode == 0, res.stderr
    first, *wrapper = res.stdout.splitlines()
    assert first.startswith("mpiexec -n 8 -ppn 4 -bind-to user:0+1+") and wrapper[0] == "#!/bin/bash"


@pytest.mark.parametrize(
    ("prof", "launcher", "allowed"),
    [("generic-pbs", "srun", "'mpiexec' or 'mpirun'"), ("generic-slurm-gpu", "mpiexec", "'srun' or 'mpirun'"),
     ("generic-flux", "mpiexec", "'flux'")],
)  # fmt: skip
def test_launcher_override_must_fit_the_scheduler(prof: str, launcher: str, allowed: str) -> None:
    res = cli("render", "--profile", prof, "--launcher", launcher, "--", "true")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        f"launcher {launcher!r} cannot start ranks under" in res.stderr
        and f"allowed: {allowed}" in res.stderr
    )


@pytest.mark.parametrize("rpn", [1, 2])
def test_launch_line_under_real_hydra(rpn: int, tmp_path: Path) -> None:
    """The rendered script's hydra launch line, run by the real MPICH hydra mpiexec of the MPICH wheel on a
    node shaped like this machine (2 cores, 2 GPUs): each rank is bound to the CPU the RankMap gives it and
    the wrapper, reading hydra's own MPI_LOCALRANKID, shows it only its GPU."""
    import os

    import yaml
    from support import flavour_python

    hydra = Path(flavour_python("mpich")).parent / "mpiexec"
    if len(os.sched_getaffinity(0)) < 2 or not hydra.exists():
        pytest.skip("needs 2 usable CPUs and the MPICH wheel's mpiexec (make setup)")
    data = yaml.safe_load(profile.source_of("generic-pbs")[1])
    data["node"].update(
        sockets=1,
        cores_per_socket=2,
        threads_per_core=1,
        numa=[{"id": 0, "cores": "0-1"}],
        gpus=[{"index": 0, "numa": 0}, {"index": 1, "numa": 0}],
        nics=[],
    )
    path = tmp_path / "two-cores.yaml"
    path.write_text(yaml.safe_dump(data))
    probe = (
        "import json, os; print('PROBE ' + json.dumps({'rank': os.environ['PMI_RANK'], "
        "'local': os.environ['MPI_LOCALRANKID'], 'cpus': sorted(os.sched_getaffinity(0)), "
        "'gpus': os.environ.get('CUDA_VISIBLE_DEVICES')}), flush=True)"
    )
    command = (sys.executable, "-c", probe)
    rm = mapping.build(profile.load(str(path)), JobSpec(nodes=1, ranks_per_node=rpn, steps=(Step(command),)))
    text = render_plan(make_plan(str(path), nodes=1, ranks_per_node=rpn, command=command))
    assert "-bind-to user:" in text
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\n")
    env = {
        "PATH": f"{hydra.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "9.real",
        "PBS_O_WORKDIR": str(tmp_path),
    }
    res = run_rendered(tmp_path, text, env)
    assert res.returncode == 0, res.stderr
    got = sorted(probes(res.stdout), key=lambda r: int(r["rank"]))
    assert got == [
        {
            "rank": str(r.rank),
            "local": str(r.slot.local_rank),
            "cpus": list(r.slot.cpus),
            "gpus": str(r.slot.gpus[0]),
        }
        for r in rm.ranks()
    ]


def test_ngpus_can_be_left_out(tmp_path: Path) -> None:
    """Sites that schedule whole nodes and define no ngpus resource: `site.pbs.ngpus: false`."""
    path = derived_profile(tmp_path, "generic-pbs", pbs={"ngpus": False, "select": {"system": "polaris"}})
    p = make_plan(path, nodes=2, command=("true",))
    assert ("-l", "select=2:ncpus=64:system=polaris") in [(d.flag, d.value) for d in p.directives]


@pytest.mark.parametrize(
    ("ncpus", "chunk"),
    [(False, "select=2:ngpus=4"), (True, "select=2:ncpus=64:ngpus=4"), (16, "select=2:ncpus=16:ngpus=4")],
)
def test_ncpus_can_be_left_out(ncpus: bool | int, chunk: str, tmp_path: Path) -> None:
    """`site.pbs.ncpus: false` leaves `:ncpus=` out (ALCF asks for whole nodes by `system` alone); true is the
    default (every hardware thread), a number is that many."""
    path = derived_profile(tmp_path, "generic-pbs", pbs={"ncpus": ncpus})
    p = make_plan(path, nodes=2, command=("true",))
    assert ("-l", chunk) in [(d.flag, d.value) for d in p.directives]


@pytest.mark.parametrize("ncpus", [0, "64", 1.5])
def test_bad_ncpus_names_the_field(ncpus: object, tmp_path: Path) -> None:
    path = derived_profile(tmp_path, "generic-pbs", pbs={"ncpus": ncpus})
    res = cli("profiles", "validate", path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "site.pbs.ncpus" in line
