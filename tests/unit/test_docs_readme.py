"""The README's commands work as written, and its set-up commands are the ones CI runs.

Every `hpcring` line in a shell block of the README, the quickstart and the CLI reference (which holds each
command's `--help` examples) is parsed by that command's parser; those that need no MPI, cluster, network or
input file (`profiles list|show`, `map`, `render`, `submit --dry-run`) are run, so an example that needs a
flag it does not show (an account, say) fails here instead of on a user's screen.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from hpcring.cli import SUBCOMMANDS, subcommand_parser
from hpcring.schedulers import profile
from hpcring.schedulers.registry import SCHEDULERS

README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "guide" / "quickstart.md", ROOT / "docs" / "guide" / "cli.md")
OFFLINE = ("profiles", "map", "render")
OFFLINE_PROFILES = ("list", "show")
SHELL = ("", "sh", "bash", "console")


def _blocks(markdown: str) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of a page: (language, non-empty lines)."""
    blocks: list[tuple[str, list[str]]] = []
    lang: str | None = None
    for line in markdown.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang = line[3:].strip()
                blocks.append((lang, []))
            else:
                lang = None
        elif lang is not None and line.strip():
            blocks[-1][1].append(line.strip())
    return blocks


def _shell_lines(markdown: str) -> list[str]:
    return [ln for lang, lines in _blocks(markdown) if lang in SHELL for ln in lines]


def _commands(page: Path) -> list[list[str]]:
    """The `hpcring ...` command lines of the page's shell blocks, comments dropped."""
    return [
        argv
        for ln in _shell_lines(page.read_text())
        if (argv := shlex.split(ln, comments=True))[:1] == ["hpcring"]
    ]


def _runs_offline(argv: list[str]) -> bool:
    if argv[1] == "profiles":
        return argv[2] in OFFLINE_PROFILES
    return argv[1] in OFFLINE or (argv[1] == "submit" and "--dry-run" in argv)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCRING_", "HOROVOD_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


EXAMPLES = [(page, argv) for page in PAGES for argv in _commands(page)]


def test_the_pages_have_examples_of_each_offline_command() -> None:
    shown = {argv[1] for _, argv in EXAMPLES}
    assert set(OFFLINE) | {"run", "submit"} <= shown, shown


@pytest.mark.parametrize("page, argv", EXAMPLES, ids=[f"{p.name}:{' '.join(a[1:4])}" for p, a in EXAMPLES])
def test_example_parses_and_offline_ones_run(page: Path, argv: list[str], tmp_path: Path) -> None:
    assert argv[1] in SUBCOMMANDS, f"{page.name}: unknown command in {shlex.join(argv)}"
    subcommand_parser(argv[1]).parse_args(argv[2:])
    if not _runs_offline(argv):
        return
    proc = subprocess.run(
        [sys.executable, "-m", "hpcring", *argv[1:]],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{page.name}: {shlex.join(argv)} failed:\n{proc.stderr}"
    assert proc.stdout.strip() or any(tmp_path.iterdir()), f"{shlex.join(argv)} printed and wrote nothing"


def test_readme_renders_a_script_for_every_scheduler() -> None:
    """Each scheduler hpcring renders has a `render` example in the README, and is named in its text."""
    rendered = set()
    for argv in _commands(README):
        if argv[1] == "render":
            args = subcommand_parser("render").parse_args(argv[2:])
            rendered.add(profile.load(args.profile).site.scheduler)
    assert rendered == set(SCHEDULERS), f"render examples cover {sorted(rendered)}, not {sorted(SCHEDULERS)}"
    user_part = README.read_text().split("## Contributing")[0].lower()
    for name in SCHEDULERS:
        assert re.search(rf"\b{name}\b", user_part), f"the README does not name the {name} scheduler"


def test_contributing_keeps_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text()
    assert "## Contributing" in text, "the README lost its Contributing section"
    contributing = text.split("## Contributing", 1)[1]
    assert _blocks(contributing)[0][1] == ["make demo", "make test"]
    targets = re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert {"demo", "test"} <= set(targets), targets
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in ci if ln and not ln.startswith("#")]
    assert commands[-1] == "make test", (
        f".ci/run must end by running the README's test command: {commands[-1]}"
    )
