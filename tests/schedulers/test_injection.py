"""Injection: hostile strings in the job name, command arguments, environment values and paths are rendered,
the script runs under bash with stand-in launchers that record their argv and environment, and what they
recorded equals the input exactly; a canary proves nothing else ran. A newline bound for a directive line is
refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings
from sched_helpers import make_plan, render_plan, shellcheck

from hpcring.errors import ConfigError
from hpcring.schedulers import containers, pbs_batch, profile, shell
from hpcring.schedulers.model import HostMpi

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": {{k: os.environ.get(k) for k in ("HPCRING_JOB_NAME", "PAYLOAD",
                        "MASTER_ADDR")}},
                        "cwd": os.getcwd()}}) + "\\n")
"""

NASTY = [
    "plain",
    "two words",
    "it's",
    'say "hi"',
    "$(touch {canary})",
    "`touch {canary}`",
    "; touch {canary}",
    "'; touch {canary}; '",
    '"; touch {canary}; "',
    "$HOME ${PATH} $$ $1",
    "back\\slash\\",
    "line\nbreak; touch {canary}",
    "tab\there",
    "#not a comment",
    "*.py ?",
    "-x",
    "",
    "ünïcödé ✓",
    "a\\'b",
    "HPCRING_EOF",
]


def _image(prof: Any, payload: str) -> str:
    """An image the site's runtime takes: a SquashFS file for CSCS's Container Engine (which refuses .sif),
    an Apptainer image elsewhere."""
    engine = prof.site.container is not None and prof.site.container.runtime == "container-engine"
    return f"/img/{payload}.sqsh" if engine else f"/img/{payload}.sif"


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Any]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = RECORDER.format(python=sys.executable)
    for tool in ("srun", "jsrun", "mpirun", "mpiexec", "module"):
        (bin_dir / tool).write_text(recorder)
        (bin_dir / tool).chmod(0o755)
    # flux answers `flux hostlist` (the script asks it for MASTER_ADDR) and records `flux run`.
    flux = recorder.replace(
        "import json, os, sys\n",
        "import json, os, sys\nif sys.argv[1:2] == ['hostlist']:\n    print('node1'); sys.exit(0)\n",
    )
    (bin_dir / "flux").write_text(flux)
    (bin_dir / "flux").chmod(0o755)
    for tool, body in (("scontrol", "echo node1"), ("apptainer", "true"), ("singularity", "true")):
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("batch1\nh1\nh1\n")
    nodefile = tmp_path / "pbs-nodes"
    nodefile.write_text("node1\nnode2\n")
    return {
        "tmp": tmp_path,
        "bin": bin_dir,
        "canary": tmp_path / "canary",
        "hostfile": hostfile,
        "nodefile": nodefile,
    }


def run_script(
    box: dict[str, Any], text: str, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    tmp: Path = box["tmp"]
    script = tmp / "job.sh"
    script.write_text(text)
    record = tmp / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {
        "PATH": f"{box['bin']}:/usr/bin:/bin",
        "RECORD": str(record),
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_ID": "42",
        "LSB_JOBID": "42",
        "LSB_DJOB_HOSTFILE": str(box["hostfile"]),
        "PBS_NODEFILE": str(box["nodefile"]),
        "PBS_JOBID": "42",
        "PBS_O_WORKDIR": str(tmp),
        "FLUX_JOB_ID": "42",
        "TMPDIR": str(tmp),
        "HOME": str(tmp),
        **(extra_env or {}),
    }
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return res, calls


def expected_launch(
    plan_argv: tuple[str, ...], box: dict[str, Any], workdir: Path | None = None
) -> list[str]:
    """The step argv with hpcring's own Raw expressions expanded as bash will expand them."""
    out = []
    for word in plan_argv[1:]:
        if isinstance(word, shell.Raw):
            word = word.replace('"$HPCRING_ERF"', str(box["tmp"] / "hpcring-42.erf"))
            word = word.replace('"$HPCRING_RANKFILE"', str(box["tmp"] / "hpcring-42.rankfile"))
            # The GPU wrapper every node runs is written in the job's working directory.
            word = word.replace('"$HPCRING_AFFINITY"', str((workdir or box["tmp"]) / ".hpcring-42.affinity"))
        out.append(str(word))
    return out


def check(profile: str, payload: str, box: dict[str, Any], **extra: Any) -> None:
    canary: Path = box["canary"]
    payload = payload.replace("{canary}", str(canary))
    workdir = box["tmp"] / f"dir {len(payload)}"
    workdir.mkdir(exist_ok=True)
    # Job names land on a directive line, where line breaks are refused (tested below).
    name = " ".join(payload.splitlines())
    p = make_plan(
        profile,
        nodes=2,
        account="acct",
        name=name,
        env=(("PAYLOAD", payload),),
        workdir=str(workdir),
        command=("python3", "-c", "pass", payload, f"--opt={payload}", payload * 2),
        **extra,
    )
    res, calls = run_script(box, render_plan(p))
    assert res.returncode == 0, res.stderr
    assert not canary.exists(), "injected command ran"
    launcher = p.steps[0].argv[0]
    launches = [c for c in calls if c["tool"] == launcher]
    others = [c for c in calls if c["tool"] not in (launcher, "module")]
    assert others == [], others
    assert len(launches) == 1
    (call,) = launches
    assert call["argv"] == expected_launch(p.steps[0].argv, box, workdir)
    tail = call["argv"][-3:]
    assert tail == [payload, f"--opt={payload}", payload * 2]
    assert call["env"]["PAYLOAD"] == payload
    assert call["env"]["HPCRING_JOB_NAME"] == name
    first_host = {"summit": "h1", "generic-lsf": "batch1"}.get(
        profile, "node1"
    )  # summit skips its launch node
    assert call["env"]["MASTER_ADDR"] == first_host
    assert call["cwd"] == str(workdir)
    # The job name's directive line parses back (sbatch's quoting rules, which flux's shell-like split and
    # LSF share) to the name itself; qsub gets the name made of the characters it accepts.
    prefixes = ("#SBATCH --job-name=", "#BSUB -J ", "# flux: --job-name=", "#PBS -N ")
    (line,) = [ln for ln in render_plan(p).splitlines() if ln.startswith(prefixes)]
    prefix = next(x for x in prefixes if line.startswith(x))
    expected = pbs_batch.job_name(name) if prefix == "#PBS -N " else name
    assert shell.parse_directive_value(line[len(prefix) :]) == expected


@pytest.mark.parametrize("payload", NASTY, ids=range(len(NASTY)))
@pytest.mark.parametrize("profile", ["frontier", "summit", "generic-lsf", "generic-pbs", "generic-flux"])
def test_nasty_strings_reach_the_ranks_verbatim(profile: str, payload: str, sandbox: dict[str, Any]) -> None:
    check(profile, payload, sandbox)


def expected_host_mpi_words(host_mpi: HostMpi, env: dict[str, str]) -> list[str]:
    """The runtime words the bind model must produce, from the profile's fields and the job's environment."""

    def sub(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], value)

    words: list[str] = []
    for b in host_mpi.binds:
        words += ["--bind", sub(b)]
    for lib in host_mpi.libs:
        words += ["--bind", f"{sub(lib)}:{containers.HOST_LIBS_DIR}/{lib.rsplit('/', 1)[1]}"]
    dirs = [sub(d) for d in host_mpi.lib_dirs] + ([containers.HOST_LIBS_DIR] if host_mpi.libs else [])
    words += ["--env", "LD_LIBRARY_PATH=" + ":".join([*dirs, "/.singularity.d/libs", "$LD_LIBRARY_PATH"])]
    words += ["--env", f"MPI4PY_LIBMPI={host_mpi.soname}"]
    if host_mpi.preload:
        words += ["--env", "LD_PRELOAD=" + ":".join(sub(p) for p in host_mpi.preload)]
    return words


@pytest.mark.parametrize("payload", ["$(touch {canary})", "a b;c", "x'y\"z\nw"])
def test_container_paths_and_binds(payload: str, sandbox: dict[str, Any]) -> None:
    """Hostile image and bind paths, and hostile values in the variables the host MPI paths expand (set by
    site modules at run time): each reaches the runtime as one word, exactly, and nothing runs."""
    payload = payload.replace("{canary}", str(sandbox["canary"]))
    image = sandbox["tmp"] / f"img {payload.replace('/', '_')} $(touch canary).sif"
    image.write_text("")
    p = make_plan(
        "frontier",
        nodes=1,
        account="a",
        image=str(image),
        binds=(f"/data/{payload}:/d",),
        command=("python", payload),
    )
    assert p.container is not None and p.container.model == "bind"
    module_env = {name: f"/opt/{name} {payload}" for name in p.container.required_vars}
    res, calls = run_script(sandbox, render_plan(p), module_env)
    assert res.returncode == 0, res.stderr
    assert not sandbox["canary"].exists()
    (call,) = [c for c in calls if c["tool"] == "srun"]
    i = call["argv"].index("apptainer")
    host_mpi = profile.load("frontier").site.container.host_mpi  # type: ignore[union-attr]
    assert host_mpi is not None
    assert call["argv"][i:] == [
        "apptainer",
        "exec",
        "--rocm",
        "--bind",
        "/lustre/orion",
        *expected_host_mpi_words(host_mpi, module_env),
        "--bind",
        f"/data/{payload}:/d",
        str(image),
        "python",
        payload,
    ]


@pytest.mark.parametrize("unset", ["CRAY_MPICH_ROOTDIR", "LD_LIBRARY_PATH"])
def test_unset_host_mpi_variable_stops_before_any_launch(unset: str, sandbox: dict[str, Any]) -> None:
    image = sandbox["tmp"] / "train.sif"
    image.write_text("")
    p = make_plan("frontier", nodes=1, account="a", image=str(image), command=("true",))
    assert p.container is not None and unset in p.container.required_vars
    env = {name: "/opt/x" for name in p.container.required_vars if name != unset}
    res, calls = run_script(sandbox, render_plan(p), env)
    assert res.returncode == 2
    assert f"hpcring: {unset} is not set; the host MPI paths of the profile" in res.stderr
    assert [c for c in calls if c["tool"] == "srun"] == []


def test_missing_image_stops_before_any_launch(sandbox: dict[str, Any]) -> None:
    p = make_plan("frontier", nodes=1, account="a", image=str(sandbox["tmp"] / "nope.sif"), command=("true",))
    res, calls = run_script(sandbox, render_plan(p))
    assert res.returncode == 2 and "container image not found" in res.stderr
    assert [c for c in calls if c["tool"] == "srun"] == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payload=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30
    )
)
def test_random_strings_round_trip(payload: str, sandbox: dict[str, Any]) -> None:
    check("generic-slurm-gpu", payload, sandbox)


_RANDOM = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30
)


@pytest.mark.parametrize("name", ["generic-pbs", "generic-flux"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_RANDOM)
@example(payload="then")  # a bash keyword: safe characters, yet shellcheck reads it bare as a keyword
@example(payload="done")
def test_random_strings_pbs_flux_round_trip_and_shellcheck(
    name: str, payload: str, sandbox: dict[str, Any]
) -> None:
    """Random text reaches PBS and Flux ranks verbatim, and the script stays shellcheck-clean."""
    check(name, payload, sandbox)
    line = " ".join(payload.splitlines()) or "x"
    p = make_plan(
        name,
        nodes=1,
        name=line,
        output=line,
        env=(("PAYLOAD", payload),),
        modules=(payload or "m",),
        image=f"/img/{payload}.sif",
        binds=(f"/d/{payload}",),
        command=("python3", payload),
    )
    script = sandbox["tmp"] / "random.sh"
    script.write_text(render_plan(p))
    shellcheck(script)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "job\n#SBATCH --qos=vip"),
        ("output", "out\n.log"),
        ("error", "e\r"),
        ("account", "a\nb"),
        ("partition", "gpu\n"),
    ],
)
@pytest.mark.parametrize(
    ("profile", "prefix"),
    [
        ("generic-slurm-gpu", "#SBATCH"),
        ("generic-lsf", "#BSUB"),
        ("generic-pbs", "#PBS"),
        ("generic-flux", "# flux:"),
    ],
)
def test_newline_in_directive_values_is_refused(profile: str, prefix: str, field: str, value: str) -> None:
    job: dict[str, Any] = {"command": ("true",), field: value}
    with pytest.raises(
        ConfigError, match=rf"contains a (newline|carriage return); it would end the {prefix} line"
    ):
        if field == "partition":
            from hpcring.schedulers import planner

            planner.check_values(
                __import__("hpcring.schedulers.job", fromlist=["JobSpec"]).JobSpec(partition=value),
                None,
                prefix,
            )
        else:
            make_plan(profile, **job)


def test_directive_quoting_round_trips_sbatch_rules() -> None:
    for value in ["a b", 'q"uote', "back\\slash", "#hash", "it's", "%x-%j.out", "$(x)"]:
        rendered = shell.directive_value(value)
        assert shell.parse_directive_value(rendered) == value, (value, rendered)


def _hostile_scripts(tmp: Path) -> list[Path]:
    """Every built-in profile rendered with a hostile string in every user field: job name, command, steps,
    environment values, modules, working directory, output paths and, where the site runs containers, the
    same job again with a hostile image and binds (container off and on)."""
    scripts = []
    for name in profile.builtin_names():
        prof = profile.load(name)
        if prof.site.scheduler == "kubernetes":  # a manifest, not a script: test_kubernetes_injection.py
            continue
        for i, raw in enumerate(NASTY):
            payload = raw.replace("{canary}", str(tmp / "canary"))
            line = " ".join(payload.splitlines())
            job: dict[str, Any] = {
                "nodes": 1,
                "account": "acct",
                "name": line or "x",
                "output": line or "o",
                "error": line or "e",
                "workdir": f"/work/{payload}",
                "env": (("PAYLOAD", payload), ("OTHER", payload * 2)),
                "modules": (payload or "m",),
                "command": ("python3", payload, f"--opt={payload}"),
            }
            script = tmp / f"{name}-{i}.sh"
            script.write_text(render_plan(make_plan(name, **job)))
            scripts.append(script)
            if prof.site.container is not None:  # the same job in the site's container too
                job.update(image=_image(prof, payload), binds=(f"/data/{payload}:/d",))
                script = tmp / f"{name}-{i}-container.sh"
                script.write_text(render_plan(make_plan(name, **job)))
                scripts.append(script)
    return scripts


def test_every_profile_shellcheck_clean_with_hostile_fields(tmp_path: Path) -> None:
    """No shellcheck finding at its default severity, whatever a user puts in any field (one shellcheck run
    over all scripts)."""
    shellcheck(*_hostile_scripts(tmp_path))
    # The per-rank GPU wrapper of PBS jobs is a script of its own: shellcheck it too.
    wrapper = tmp_path / "affinity.sh"
    wrapper.write_text(make_plan("generic-pbs", nodes=1, command=("true",)).files[0].content)
    shellcheck(wrapper)


def test_every_launcher_shellcheck_clean_with_hostile_fields(tmp_path: Path) -> None:
    """Every built-in profile under every launcher its scheduler allows (mpirun under PBS and LSF, not only
    the site's default), a hostile string in every user field, the account included, with and without the
    site's container where it has one; one shellcheck run."""
    from hpcring.schedulers import mapping, planner
    from hpcring.schedulers.job import JobSpec, Step
    from hpcring.schedulers.model import LAUNCHERS_OF

    payloads = [p for p in NASTY if any(c in p for c in "'\"\\$`;#*\t\n")]
    scripts = []
    for name in profile.builtin_names():
        prof = profile.load(name)
        if prof.site.scheduler == "kubernetes":  # a manifest, not a script: test_kubernetes_injection.py
            continue
        for launcher in LAUNCHERS_OF[prof.site.scheduler]:
            # CSCS's Container Engine starts ranks through srun only (test_site_alps.py checks the refusal).
            engine_elsewhere = prof.site.container is not None and (
                prof.site.container.runtime == "container-engine" and launcher != "srun"
            )
            containers = (
                (False, True) if prof.site.container is not None and not engine_elsewhere else (False,)
            )
            for i, payload in enumerate(payloads):
                for ctr in containers:
                    line = " ".join(payload.splitlines())
                    spec = JobSpec(
                        nodes=1,
                        account=line,
                        name=line,
                        output=line,
                        env=(("PAYLOAD", payload),),
                        modules=(payload,),
                        workdir=f"/work/{payload}",
                        image=_image(prof, payload) if ctr else None,
                        binds=(f"/data/{payload}:/d",) if ctr else (),
                        steps=(Step(("python3", payload)), Step(("true", f"--opt={payload}"))),
                    )
                    p = planner.build(mapping.build(prof, spec), spec, launcher_name=launcher)
                    script = tmp_path / f"{name}-{launcher}-{i}{'-container' if ctr else ''}.sh"
                    script.write_text(render_plan(p))
                    scripts.append(script)
    shellcheck(*scripts)


def test_bash_keywords_are_quoted_as_words() -> None:
    """`shlex.quote` leaves keywords bare; the scripts' quoting does not, so shellcheck never reads a
    value as a misplaced `then` or `do` (SC1010)."""
    from hpcring.schedulers.shell import join, quote

    assert [quote(w) for w in ("then", "do", "{", "ok", "then now")] == [
        "'then'",
        "'do'",
        "'{'",
        "ok",
        "'then now'",
    ]
    assert join(["python3", "fi"]) == "python3 'fi'"
