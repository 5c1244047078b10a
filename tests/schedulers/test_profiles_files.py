"""Profile files that cannot be read as text: exit 2 with one line naming the file and the reason, through the
real CLI (`profiles validate`, `map --profile`), never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sched_helpers import cli

from hpcring.schedulers import profile


def _one_clear_line(res: subprocess.CompletedProcess[str], *pieces: str) -> None:
    rc, err = res.returncode, res.stderr
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for piece in pieces:
        assert piece in lines[0], (piece, lines[0])


@pytest.mark.parametrize("command", [("profiles", "validate"), ("map", "--profile")])
def test_non_utf8_profile(tmp_path: Path, command: tuple[str, ...]) -> None:
    text = profile.source_of("generic-lsf")[1] + "# caf\xe9 (Latin-1)\n"
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(text.encode("latin-1"))
    offset = text.encode("latin-1").index(b"\xe9")
    res = cli(*command, str(bad))
    _one_clear_line(res, str(bad), "is not UTF-8 text", f"byte 0xe9 at offset {offset}")


@pytest.mark.parametrize("command", [("profiles", "validate"), ("map", "--profile")])
@pytest.mark.parametrize("name", ["site.yaml", "profiles/"])
def test_directory_as_profile(tmp_path: Path, command: tuple[str, ...], name: str) -> None:
    d = tmp_path / name
    d.mkdir()
    res = cli(*command, str(d) + ("/" if name.endswith("/") else ""))
    _one_clear_line(res, str(d), "is a directory, not a file")


def test_bare_directory_name(tmp_path: Path) -> None:
    (tmp_path / "mysite").mkdir()
    res = cli("map", "--profile", "mysite", cwd=tmp_path)
    _one_clear_line(res, "'mysite' is a directory, not a file")
    val = cli("profiles", "validate", "mysite", cwd=tmp_path)
    _one_clear_line(val, "'mysite' is a directory, not a file")


def test_missing_file_still_says_so(tmp_path: Path) -> None:
    res = cli("profiles", "validate", str(tmp_path / "nope.yaml"))
    _one_clear_line(res, "nope.yaml", "does not exist")


@pytest.mark.parametrize(
    "command",
    [
        ("render", "--nodes", "1", "--profile", "{p}", "--", "true"),
        ("submit", "--dry-run", "--nodes", "1", "--profile", "{p}", "--", "true"),
        ("profiles", "show", "{p}"),
    ],
    ids=["render", "submit", "show"],
)
@pytest.mark.parametrize("kind", ["latin-1", "directory"])
def test_every_command_reading_a_profile(tmp_path: Path, command: tuple[str, ...], kind: str) -> None:
    """render, submit and profiles show read profiles through the same loader: the same one line, exit 2."""
    if kind == "directory":
        bad = tmp_path / "site.yaml"
        bad.mkdir()
        reason = "is a directory, not a file"
    else:
        bad = tmp_path / "latin1.yaml"
        bad.write_bytes((profile.source_of("generic-pbs")[1] + "# caf\xe9\n").encode("latin-1"))
        reason = "is not UTF-8 text"
    res = cli(*(str(bad) if a == "{p}" else a for a in command), cwd=tmp_path)
    _one_clear_line(res, str(bad), reason)
