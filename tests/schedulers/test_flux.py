"""Flux: golden scripts (with and without a container), shellcheck, the Plan's numbers, a rendered script run
under stand-in `flux batch` / `flux run` (each task's binding is Flux's per-task placement), and `hpcring
submit` (dry run, exit codes, a job purged before its end was seen).

Regenerate the golden files after an intended change with `HPCRING_UPDATE_GOLDEN=1 pytest
tests/schedulers/test_flux.py`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pbs_flux_helpers import (
    PROBE,
    TRAIN,
    calls,
    derived_profile,
    probes,
    tools_env,
)
from sched_helpers import check_golden, check_shellcheck, cli, make_plan, render_plan

from hpcring.cli.job_flags import NOT_WRITTEN
from hpcring.schedulers import flux_jobs, mapping, profile, shell, walltime
from hpcring.schedulers.job import JobSpec

VARIANTS = {
    "generic-flux-flux": {"nodes": 2, "command": TRAIN, "account": "guests", "partition": "pdebug"},
    "generic-flux-container": {
        "nodes": 2,
        "image": "/p/lustre1/img/hpcring-gpu.sif",
        "binds": ("/p/lustre1",),
        "command": TRAIN,
        "name": 'it\'s a "job"',
    },
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden_and_shellcheck(variant: str, tmp_path: Path) -> None:
    text = render_plan(make_plan("generic-flux", **VARIANTS[variant]))
    check_golden(variant, text)
    check_shellcheck(tmp_path, text)


def test_plan_numbers(tmp_path: Path) -> None:
    p = make_plan("generic-flux", nodes=2, ranks_per_node=2, gpus_per_rank=2, time_s=5400, command=TRAIN)
    d = [(x.flag, x.value) for x in p.directives]
    assert d == [
        ("--job-name", "hpcring"),
        ("-N", "2"),
        ("-n", "4"),
        ("-c", "16"),
        ("-g", "2"),
        ("-t", "90m"),
        ("-q", "pbatch"),
        ("--exclusive", None),
    ]
    (step,) = p.steps
    assert step.argv == (
        "flux", "run", "-N", "2", "-n", "4", "-c", "16", "-g", "2", "--exclusive",
        "-o", "cpu-affinity=per-task", "-o", "gpu-affinity=per-task", *TRAIN,
    )  # fmt: skip
    assert p.submit_argv == ("flux", "batch") and p.directive_prefix == "# flux:"
    path = derived_profile(
        tmp_path,
        "generic-flux",
        binding=False,
        flux={"exclusive": False, "setattr": {"system.bank": "b1"}, "extra_directives": ["--urgency=8"]},
    )
    q = make_plan(path, nodes=1, gpus_per_rank=0, ranks_per_node=2, time_s=61, command=("true",))
    assert ("--setattr", "system.bank=b1") in [(x.flag, x.value) for x in q.directives]
    assert ("--urgency", "8") in [(x.flag, x.value) for x in q.directives]
    assert "--exclusive" not in q.steps[0].argv and "cpu-affinity=off" in q.steps[0].argv
    assert "-g" not in q.steps[0].argv and walltime.flux(61) == "61s"


def test_directives_read_back_as_flux_splits_them() -> None:
    """`# flux:` lines are split with shell rules: hostile names and paths come back whole."""
    import shlex

    for value in ["it's", 'a "b"', "$(x) `y`", "back\\slash", "#hash", "two  spaces"]:
        p = make_plan("generic-flux", nodes=1, name=value, output=value, command=("true",))
        text = render_plan(p)
        lines = [ln[len("# flux:") :] for ln in text.splitlines() if ln.startswith("# flux: --")]
        words = [w for ln in lines for w in shlex.split(ln)]
        assert f"--job-name={value}" in words and f"--output={value}" in words
        assert shell.directive_value(value)  # and the same quoting as #SBATCH


def _probe_script(tmp_path: Path, nodes: int, rpn: int, gpr: int, env: dict[str, str]) -> str:
    res = cli(
        "render", "--profile", "generic-flux", "--nodes", str(nodes), "--ranks-per-node", str(rpn),
        "--gpus-per-rank", str(gpr), "--", *PROBE, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize(("nodes", "rpn", "gpr"), [(1, 1, 1), (2, 2, 2), (2, 4, 1)])
def test_batch_script_under_standin_flux(nodes: int, rpn: int, gpr: int, tmp_path: Path) -> None:
    """Submit the rendered script with `hpcring submit --wait`: flux batch reads its directives, the script
    asks the instance for its first host, and flux run gives task i of each node its share of cores and
    GPUs, as Flux's per-task affinity does."""
    env = tools_env(tmp_path)
    script = tmp_path / "probe.sh"
    script.write_text(_probe_script(tmp_path, nodes, rpn, gpr, env))
    res = cli(
        "submit", "--profile", "generic-flux", "--nodes", str(nodes), "--ranks-per-node", str(rpn),
        "--gpus-per-rank", str(gpr), "--wait", "--poll", "0.1", "-o", str(script), "--", *PROBE,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (job_id,) = res.stdout.splitlines()
    assert job_id.startswith("ƒ") and flux_jobs.job_id(res.stdout) == job_id
    out = (tmp_path / f"flux-{job_id}.out").read_text()
    shape = mapping.resolve(
        profile.load("generic-flux"), JobSpec(nodes=nodes, ranks_per_node=rpn, gpus_per_rank=gpr)
    )
    cores = shape.cpus_per_rank  # flux run -c: Flux gives task i of a node cores i*c .. i*c+c-1
    got = sorted(probes(out), key=lambda r: int(r["FLUX_TASK_RANK"]))
    assert len(got) == nodes * rpn
    for rank, r in enumerate(got):
        node, local = divmod(rank, rpn)
        assert r["STANDIN_HOST"] == f"node{node + 1}"
        assert r["CUDA_VISIBLE_DEVICES"] == ",".join(str(local * gpr + g) for g in range(gpr))
        assert r["STANDIN_CPUS"] == ",".join(str(c) for c in range(local * cores, (local + 1) * cores))
    tools = [(c["tool"], c["argv"][0]) for c in calls(env)]
    assert tools[0] == ("flux", "batch") and ("flux", "hostlist") in tools and ("flux", "run") in tools


@pytest.mark.parametrize(("step", "code"), [("true", 0), ("exit 5", 5), ("kill -TERM $$", 143)])
def test_submit_wait_returns_the_job_exit_code(step: str, code: int, tmp_path: Path) -> None:
    env = tools_env(tmp_path)
    res = cli(
        "submit", "--profile", "generic-flux", "--nodes", "1", "--ranks-per-node", "1", "--wait",
        "--poll", "0.1", "--script-dir", str(tmp_path / "jobs"), "--step", step, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == code, res.stderr
    state = "COMPLETED" if code == 0 else "FAILED"
    assert f"ended: {state}, exit code {code}" in res.stderr
    (script,) = (tmp_path / "jobs").glob("hpcring-*.sh")
    first = calls(env)[0]
    assert first == {"tool": "flux", "argv": ["batch", str(script)]}


def test_purged_job_and_dry_run(tmp_path: Path) -> None:
    env = tools_env(tmp_path, STANDIN_FLUX_PURGE="1")
    base = ["submit", "--profile", "generic-flux", "--nodes", "1", "--script-dir", str(tmp_path / "jobs")]
    res = cli(*base, "--wait", "--poll", "0.1", "--step", "sleep 0.5", env=env, cwd=tmp_path)
    assert (
        res.returncode == 1 and "is no longer known to Flux" in res.stderr and "Traceback" not in res.stderr
    )
    out = tmp_path / "d" / "job.sh"
    dry = cli(*base, "--dry-run", "-o", str(out), "--", "true", env=env, cwd=tmp_path)
    assert dry.returncode == 0
    rendered = cli("render", "--profile", "generic-flux", "--nodes", "1", "--", "true", env=env)
    assert dry.stdout == f"# script: {out} {NOT_WRITTEN}\n{rendered.stdout}# would run: flux batch {out}\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("result", "rc", "code"),
    [("COMPLETED", 0, 0), ("FAILED", 3, 3), ("FAILED", -9, 137), ("CANCELED", -128, 1), ("TIMEOUT", 0, 1)],
)
def test_exit_codes(result: str, rc: int, code: int) -> None:
    assert flux_jobs.exit_code(result, rc) == code


def test_job_id_parsing() -> None:
    assert flux_jobs.job_id("ƒ2Ek1ZUx5bq\n") == "ƒ2Ek1ZUx5bq"
    assert flux_jobs.job_id("f2Ek1ZUx5bq\n") == "f2Ek1ZUx5bq"
    assert flux_jobs.job_id("1234567\n") == "1234567"
    assert flux_jobs.job_id("error\n") is None


def test_standin_refuses_bad_directive(tmp_path: Path) -> None:
    env = tools_env(tmp_path)
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\n# flux: -t soon\ntrue\n")
    res = subprocess.run(["flux", "batch", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 1 and "invalid Flux standard duration" in res.stderr


def test_map_format_flux() -> None:
    res = cli("map", "--profile", "generic-flux", "--nodes", "2", "--format", "flux")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        "flux run -N 2 -n 8 -c 8 -g 1 --exclusive -o cpu-affinity=per-task -o gpu-affinity=per-task\n"
    )


def test_map_format_flux_quotes_map_affinity() -> None:
    """`map:` values hold `;` between tasks: the printed line must survive being pasted into a shell."""
    import shlex

    res = cli("map", "--profile", "tuolumne", "--nodes", "1", "--format", "flux")
    assert res.returncode == 0, res.stderr
    words = shlex.split(res.stdout)
    assert words[:2] == ["flux", "run"]
    cpu = next(w for w in words if w.startswith("cpu-affinity="))
    assert cpu == "cpu-affinity=map:0-23,96-119;24-47,120-143;48-71,144-167;72-95,168-191"
    assert "gpu-affinity=map:0;1;2;3" in words


@pytest.mark.parametrize(("nodes", "rpn"), [(1, 2), (2, 4)])
def test_map_affinity_binds_the_rankmap_devices(nodes: int, rpn: int, tmp_path: Path) -> None:
    """`site.flux.cpu_affinity: map` and `gpu_affinity: map`: flux run gets the RankMap's own CPUs and GPUs
    per local task (`map:A;B;...`); run through the stand-in flux, each task lands on exactly those (here with
    reserved cores, where Flux's per-task shares would differ)."""
    import yaml

    data = yaml.safe_load(profile_text("generic-flux"))
    data["node"]["reserved_cores"] = [0, 16]
    data["site"]["flux"] = {"exclusive": True, "cpu_affinity": "map", "gpu_affinity": "map"}
    path = tmp_path / "mapped.yaml"
    path.write_text(yaml.safe_dump(data))
    rm = mapping.build(profile.load(str(path)), JobSpec(nodes=nodes, ranks_per_node=rpn))
    text = render_plan(make_plan(str(path), nodes=nodes, ranks_per_node=rpn, command=PROBE))
    assert "cpu-affinity=map:" in text and "gpu-affinity=map:" in text
    env = tools_env(tmp_path, STANDIN_FLUX_HOSTS=",".join(f"node{n + 1}" for n in range(nodes)))
    script = tmp_path / "job.sh"
    script.write_text(text)
    res = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert res.returncode == 0, res.stderr
    got = sorted(probes(res.stdout), key=lambda r: int(r["FLUX_TASK_RANK"]))
    assert [(r["STANDIN_HOST"], r["STANDIN_CPUS"], r["CUDA_VISIBLE_DEVICES"]) for r in got] == [
        (f"node{r.node + 1}", ",".join(map(str, r.slot.cpus)), ",".join(map(str, r.slot.gpus)))
        for r in rm.ranks()
    ]


def test_map_affinity_needs_exclusive_nodes(tmp_path: Path) -> None:
    from hpcring.errors import ProfileError

    path = derived_profile(tmp_path, "generic-flux", flux={"exclusive": False, "cpu_affinity": "map"})
    with pytest.raises(
        ProfileError, match=r"site\.flux\.cpu_affinity: 'map' binds ranks .* site\.flux\.exclusive"
    ):
        profile.load(path)


def profile_text(name: str) -> str:
    return profile.source_of(name)[1]
