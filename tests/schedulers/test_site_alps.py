"""Alps (CSCS, GH200) as CSCS documents it: the NCCL-over-Slingshot environment, GPU-aware MPI off next to
NCCL, and containers through the Container Engine (an EDF and `srun --environment`).

Pages (read 2026-11-27 from github.com/eth-cscs/cscs-docs, the source of docs.cscs.ch; cited in the profile):
- https://docs.cscs.ch/software/communication/nccl/ (its included file nccl_env_vars; "GPU-aware MPI with
  NCCL"; "Containers": the EDF annotations)
- https://docs.cscs.ch/software/ml/pytorch/ (`export MPICH_GPU_SUPPORT_ENABLED=0` in the batch script)
- https://docs.cscs.ch/software/container-engine/ (run.md: `srun --environment=<absolute path | ./relative |
  name>`; edf.md: image, mounts, workdir, [env], [annotations]; `${VAR}` expansion)
- https://docs.cscs.ch/software/communication/mpich/ (`srun --mpi=pmi2 ... --environment=$PWD/osu_gpu.toml`)
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import check_shellcheck, cli, make_plan, render_plan

from hpcring.errors import ConfigError, ProfileError
from hpcring.schedulers import profile

# docs/software/communication/nccl_env_vars, verbatim (its export lines), and the pytorch page's MPICH line.
NCCL_ENV_VARS = """\
export NCCL_NET="AWS Libfabric"
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_CROSS_NIC=1
export NCCL_PROTO=^LL128
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_DEFAULT_TX_SIZE=16384
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_RX_MATCH_MODE=software
export FI_MR_CACHE_MONITOR=userfaultfd
"""
PYTORCH_MPICH = "export MPICH_GPU_SUPPORT_ENABLED=0"
# nccl.md, "Containers", the EDF it gives for NCCL in a container.
NCCL_EDF_ANNOTATIONS = """\
[annotations]
com.hooks.aws_ofi_nccl.enabled = "true"
com.hooks.aws_ofi_nccl.variant = "cuda-dl"
"""

SRUN_STANDIN = """#!/usr/bin/env python3
import json, os, shutil, sys
out = os.environ["STANDIN_OUT"]
edf = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--environment=")]
if edf:
    shutil.copy(edf[0], os.path.join(out, "edf.toml"))
json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, open(os.path.join(out, "srun.json"), "w"))
"""


def _documented_env(text: str) -> dict[str, str]:
    """NAME=VALUE of `export` lines as bash reads them."""
    out = {}
    for line in text.splitlines():
        name, value = shlex.split(line.removeprefix("export "))[0].split("=", 1)
        out[name] = value
    return out


def _run_job(tmp_path: Path, text: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the rendered job script with stand-in srun/scontrol: srun keeps its argv, environment and EDF."""
    bin_dir, out, work = tmp_path / "bin", tmp_path / "out", tmp_path / "work"
    for d in (bin_dir, out, work):
        d.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN_STANDIN)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho nid001\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(text)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STANDIN_OUT": str(out),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "nid001",
        "HOME": str(work),
    }
    res = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    return res, out


def test_nccl_env_as_cscs_documents() -> None:
    """Every line of nccl_env_vars and the pytorch page's MPICH line, with the documented values."""
    env = dict(make_plan("alps-gh200", nodes=2, account="g123", command=["python", "train.py"]).env)
    expected = _documented_env(NCCL_ENV_VARS + PYTORCH_MPICH)
    assert {k: env.get(k) for k in expected} == expected


def test_job_environment_reaches_srun(tmp_path: Path) -> None:
    """The rendered script, run with a stand-in srun, starts ranks with exactly those values."""
    text = render_plan(make_plan("alps-gh200", nodes=2, account="g123", command=["python", "train.py"]))
    check_shellcheck(tmp_path, text)
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 0, res.stderr
    got = json.loads((out / "srun.json").read_text())["env"]
    expected = _documented_env(NCCL_ENV_VARS + PYTORCH_MPICH)
    assert {k: got.get(k) for k in expected} == expected


def test_container_engine_edf_and_srun_line(tmp_path: Path) -> None:
    """`--image` renders an EDF (image, the job's directory mounted and made the workdir, --bind mounts, the
    NCCL page's hook annotations) and `srun --environment=<edf> --mpi=pmi2 ... command`: the command is not
    wrapped in a runtime."""
    image = "nvcr.io#nvidia/pytorch:25.11-py3"
    p = make_plan(
        "alps-gh200",
        nodes=2,
        account="g123",
        image=image,
        binds=("/capstor/scratch/cscs/user", "/capstor/store/cscs/proj:/data:ro"),
        command=["python", "train.py"],
    )
    text = render_plan(p)
    check_shellcheck(tmp_path, text)
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 0, res.stderr
    argv = json.loads((out / "srun.json").read_text())["argv"]
    assert argv[0].startswith("--environment=/") and argv[0].endswith("/.hpcring-42.edf.toml")
    assert "--mpi=pmi2" in argv and argv[-2:] == ["python", "train.py"]
    edf = tomllib.loads((out / "edf.toml").read_text())
    assert edf["image"] == image
    assert edf["mounts"] == [
        "${PWD}:${PWD}",
        "/capstor/scratch/cscs/user:/capstor/scratch/cscs/user",
        "/capstor/store/cscs/proj:/data:ro",
    ]
    assert edf["workdir"] == "${PWD}"
    assert edf["annotations"] == tomllib.loads(NCCL_EDF_ANNOTATIONS)["annotations"]
    assert not list((tmp_path / "work").glob(".hpcring-*")), "the inline EDF is removed when the job ends"


def test_local_squashfs_image_is_checked_before_srun(tmp_path: Path) -> None:
    text = render_plan(
        make_plan("alps-gh200", nodes=1, account="g123", image="/capstor/none.sqsh", command=["./a"])
    )
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 2
    assert "container image not found (a SquashFS file is needed): /capstor/none.sqsh" in res.stderr
    assert not (out / "srun.json").exists()


def test_user_edf(tmp_path: Path) -> None:
    """An --image ending in .toml is the user's EDF: `--environment=<path>` (a relative one gets the `./`
    the Container Engine requires), nothing generated, and a missing file stops the job before srun."""
    p = make_plan("alps-gh200", nodes=1, account="g123", image="envs/pt.toml", command=["./a"])
    assert not [f for f in p.files if f.suffix.endswith("toml")]
    text = render_plan(p)
    check_shellcheck(tmp_path, text)
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 2 and "environment definition file not found: envs/pt.toml" in res.stderr
    (tmp_path / "work" / "envs").mkdir()
    (tmp_path / "work" / "envs" / "pt.toml").write_text('image = "library/ubuntu:24.04"\n')
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "srun.json").read_text())["argv"][:2] == [
        "--environment=./envs/pt.toml",
        "--mpi=pmi2",
    ]
    with pytest.raises(ConfigError, match=r"--bind with the user EDF .*mounts"):
        make_plan("alps-gh200", nodes=1, account="g", image="/a/pt.toml", binds=("/x",), command=["./a"])


def test_render_writes_the_edf_next_to_the_script(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    res = cli(
        "render", "--profile", "alps-gh200", "--nodes", "1", "--account", "g123",
        "--image", "library/ubuntu:24.04", "-o", str(out), "--", "python", "train.py",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    edf = tomllib.loads((tmp_path / "job.edf.toml").read_text())
    assert edf["image"] == "library/ubuntu:24.04"
    words = shlex.split(next(ln for ln in out.read_text().splitlines() if ln.startswith("srun ")))
    assert words[1] == "--environment=$HPCRING_EDF"
    assert f"HPCRING_EDF={tmp_path / 'job.edf.toml'}" in out.read_text()


_HOSTILE = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\0,:"), min_size=1, max_size=30
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=_HOSTILE, bind=_HOSTILE)
def test_hostile_values_round_trip_through_the_edf(tmp_path: Path, image: str, bind: str) -> None:
    """Quotes, backslashes, `$`, backticks and unicode in the image and a bind reach the EDF exactly as
    given (TOML-escaped in the file, inert in the script's quoted here-document), and the script stays
    shellcheck-clean."""
    image = image if not image.endswith(".toml") else image + "x"
    p = make_plan(
        "alps-gh200", nodes=1, account="g123", image=image, binds=("/" + bind,), command=["python", "t.py"]
    )
    text = render_plan(p)
    res, out = _run_job(tmp_path, text)
    if image.startswith("/"):
        assert res.returncode == 2  # no such local image file ("/" itself is a directory, not an image)
        return
    assert res.returncode == 0, res.stderr
    edf = tomllib.loads((out / "edf.toml").read_text())
    assert edf["image"] == image and edf["mounts"][1] == f"/{bind}:/{bind}"


def test_hostile_values_shellcheck(tmp_path: Path) -> None:
    image = "a\"b'c$(touch pwned)`x`\\\\ ${HOME} HPCRING_EOF"
    text = render_plan(
        make_plan("alps-gh200", nodes=1, account="g123", image=image, binds=("/p q'\"",), command=["x"])
    )
    check_shellcheck(tmp_path, text)
    res, out = _run_job(tmp_path, text)
    assert res.returncode == 0, res.stderr
    assert tomllib.loads((out / "edf.toml").read_text())["image"] == image
    assert not (tmp_path / "work" / "pwned").exists()


def test_profile_checks_for_the_engine(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load(profile.source_of("alps-gh200")[1])
    data["site"]["launcher"] = "mpirun"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"container-engine' starts ranks through srun"):
        profile.load(str(path))
    data = yaml.safe_load(profile.source_of("alps-gh200")[1])
    data["site"]["container"]["annotations"]["bad key!"] = "x"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"not an annotation key"):
        profile.load(str(path))
    data = yaml.safe_load(profile.source_of("lumi-g")[1])
    data["site"]["container"]["annotations"] = {"a.b": "c"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"only for runtime 'container-engine'"):
        profile.load(str(path))


def test_engine_with_another_launcher_is_refused() -> None:
    """The Container Engine is a Slurm (srun) feature: the same job under mpirun says so instead of writing
    an `--environment` word mpirun does not know."""
    from hpcring.schedulers import mapping, planner
    from hpcring.schedulers.job import JobSpec, Step

    spec = JobSpec(nodes=1, account="g", image="library/ubuntu:24.04", steps=(Step(("true",)),))
    rm = mapping.build(profile.load("alps-gh200"), spec)
    with pytest.raises(ConfigError, match=r"'container-engine' starts ranks through srun, not 'mpirun'"):
        planner.build(rm, spec, launcher_name="mpirun")


def test_toml_string_escapes_every_control_character() -> None:
    """TOML basic strings refuse raw U+0000-U+0008, U+000A-U+001F and U+007F (DEL, which JSON's escaping
    leaves raw: found by the property test above); each one round-trips."""
    from hpcring.schedulers import container_engine

    for code in [*range(0x20), 0x7F, 0x2028, 0xFEFF]:
        value = f"a{chr(code)}b\"'\\"
        assert tomllib.loads(f"v = {container_engine.toml_string(value)}\n")["v"] == value
