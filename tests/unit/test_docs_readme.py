"""The commands of the README and of every page of docs/guide work as written, and the README's set-up
commands are the ones CI runs.

Every shell block is run, block by block, in a folder of its page's own (a copy of this checkout where the
block installs hpcring), with this environment's `python`, `pip` and `hpcring` first on PATH, except the
commands docs_commands.py lists with the reason (a cluster, Docker, a host CI cannot reach). `pip install`
lines run with `--dry-run --ignore-installed`: pip resolves everything they ask for, from PyPI and git, and
installs nothing; they run at the same time, as they mostly wait for the network. An `hpcring` command that
already ran in an earlier block is not run again. Every `hpcring` line, run or not, is parsed by its
command's parser, so an example that needs a flag it does not show fails here and not on a user's screen.
The `--help` examples are docs/guide/cli.md's blocks (generated from the parsers, test_docs_cli.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from docs_commands import (
    NOT_RUN,
    PAGES,
    SUBSTITUTED,
    Block,
    all_blocks,
    not_run_reason,
    strip_comment,
    substitute,
)
from support import ROOT

from hpcring.cli import SUBCOMMANDS, subcommand_parser
from hpcring.schedulers import profile
from hpcring.schedulers.registry import SCHEDULERS

Popen = subprocess.Popen[str]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "guide" / "quickstart.md"
# Resolve, install nothing, as in an empty environment; build hpcring's metadata with this environment's
# setuptools (the project's build requirement) rather than installing one per command.
PIP_FLAGS = "--dry-run --ignore-installed --no-build-isolation --quiet"
MARK = "hpcring-docs-test:"
SHELL_OPERATORS = (">", ">>", "|", "&&", ";")
_PASSED: set[str] = set()  # hpcring commands that ran and passed in an earlier block


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


def _commands(page: Path) -> list[list[str]]:
    """The `hpcring ...` command lines of the page's shell blocks, comments and redirections dropped."""
    found = []
    for block in BLOCKS:
        for line in block.commands if block.page == page else ():
            argv = shlex.split(line, comments=True)
            ends = [i for i, word in enumerate(argv) if word in SHELL_OPERATORS]
            if argv[:1] == ["hpcring"]:
                found.append(argv[: ends[0]] if ends else argv)
    return found


def _env(reports: Path) -> dict[str, str]:
    """This environment's python and pip first on PATH, and an `hpcring` that runs this checkout's code
    (`python -m hpcring`, whether or not an `hpcring` script is installed)."""
    shim = reports / "bin"
    if not (shim / "hpcring").exists():
        shim.mkdir(exist_ok=True)
        (shim / "hpcring").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hpcring "$@"\n')
        (shim / "hpcring").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCRING_", "HOROVOD_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(shim), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PYTHON=sys.executable, REPORTS=str(reports), HPCRING_GIT=f"file://{ROOT}", OMP_NUM_THREADS="1")
    return env


def _python_block(page: Path) -> str:
    return next(lines for lang, lines in _blocks_raw(page.read_text()) if lang == "python")


def _blocks_raw(markdown: str) -> Iterator[tuple[str, str]]:
    for found in re.finditer(r"^```(\w*)\n(.*?)^```", markdown, re.M | re.S):
        yield found.group(1), found.group(2)


def _fixtures(folder: Path, page: Path) -> None:
    """What the page's commands expect in the reader's folder: the quickstart's train.py (its Horovod form
    on the migration page) and, for clusters.md, a job file."""
    train = _python_block(QUICKSTART)
    if page.name == "migrating-from-horovod.md":
        train = train.replace("import hpcring.torch as hvd", "import horovod.torch as hvd")
    (folder / "train.py").write_text(train)
    (folder / "job.yaml").write_text("nodes: 2\ncommand: python train.py\n")


def _is_pip(block: Block) -> bool:
    return any(_runnable(block, c).startswith('"$PYTHON" -m pip') for c in block.commands)


def _runnable(block: Block, command: str) -> str:
    """The command as the test runs it ("" when it is not run)."""
    if not_run_reason(block.page, command) is not None:
        return ""
    instead = substitute(block.page, command)
    if instead is not None:
        return instead
    command = strip_comment(command)
    if command.startswith("pip install "):
        report = f'"$REPORTS/{block.page.stem}-{block.line}-{abs(hash(command))}.json"'
        return f'"$PYTHON" -m {command} {PIP_FLAGS} --report {report}'
    return command


# The install blocks start together in the background (fixture `installs`) and are checked last.
BLOCKS = sorted(all_blocks(), key=_is_pip)


def _script(block: Block, checkout: Path | None) -> str:
    lines = ["set -eo pipefail", f"trap 'echo \"{MARK} failed: $BASH_COMMAND\" >&2' ERR"]
    for i, command in enumerate(block.commands):
        run = _runnable(block, command).format(checkout=checkout, root=ROOT)
        if not run or (run.startswith("hpcring ") and run in _PASSED):
            continue
        lines += [run, f"echo '{MARK} ok {i}' >&2"]
    return "\n".join(lines) + "\n"


def _start(block: Block, folder: Path, reports: Path, checkout: Path | None) -> Popen:
    return subprocess.Popen(
        ["bash", "-c", _script(block, checkout)],
        cwd=checkout or folder,
        env=_env(reports),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _copy_checkout(target: Path) -> Path:
    """This checkout's files (as git lists them, with their working-tree content): the reader's clone."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the install commands need one")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    """A folder per page, with the files its commands expect."""
    out = {}
    for page in PAGES:
        out[page] = tmp_path_factory.mktemp(page.stem)
        _fixtures(out[page], page)
    return out


@pytest.fixture(scope="module")
def installs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Popen], Path]]:
    """The blocks with `pip install` lines, all started at once, each in its own copy of the checkout; and
    the folder of pip's reports."""
    reports = tmp_path_factory.mktemp("pip-reports")
    started = {}
    for block in filter(_is_pip, BLOCKS):
        checkout = _copy_checkout(tmp_path_factory.mktemp(f"clone-{block.page.stem}"))
        started[block.id] = _start(block, checkout, reports, checkout)
    yield started, reports
    for proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _check(block: Block, proc: Popen, timeout: float) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{block.id}: still running after {timeout:g} s:\n{output[-3000:]}")
    failed = [ln for ln in output.splitlines() if ln.startswith(f"{MARK} failed")]
    assert proc.returncode == 0, f"{block.id}: {failed or 'exit ' + str(proc.returncode)}\n{output[-4000:]}"
    return output


def _check_reports(block: Block, reports: Path) -> None:
    """Each `pip install` line resolved an hpcring to install (pip's --report)."""
    for command in block.commands:
        found = re.search(r'"\$REPORTS/([^"]+)"', _runnable(block, command))
        if found:
            report = json.loads((reports / found.group(1)).read_text())
            names = {item["metadata"]["name"] for item in report["install"]}
            assert "hpcring" in names, f"{block.id}: {command} would not install hpcring: {sorted(names)}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_documented_commands_run(
    block: Block, folders: dict[Path, Path], installs: tuple[dict[str, Popen], Path], tmp_path: Path
) -> None:
    reasons = sorted({not_run_reason(block.page, c) or "" for c in block.commands})
    if not any(_runnable(block, c) for c in block.commands):
        pytest.skip("not run here: " + "; ".join(reasons))
    started, reports = installs
    if block.id in started:
        _check(block, started[block.id], timeout=600)
        _check_reports(block, reports)
        return
    output = _check(block, _start(block, folders[block.page], tmp_path, None), timeout=300)
    for i, command in enumerate(block.commands):
        run = _runnable(block, command)
        if f"{MARK} ok {i}" in output and run.startswith("hpcring "):
            _PASSED.add(run)


def test_every_listed_exception_is_still_in_the_docs() -> None:
    """A reviewed entry whose command left the docs is stale: remove it (or review the changed command)."""
    lines = [(b.page.name, c) for b in BLOCKS for c in b.commands]
    for name, pattern, _ in NOT_RUN:
        assert any(name in ("*", p) and re.fullmatch(pattern, c) for p, c in lines), pattern
    for name, line, _, _ in SUBSTITUTED:
        assert (name, line) in lines, line


EXAMPLES = [(page, argv) for page in PAGES for argv in _commands(page)]


def test_the_pages_have_examples_of_each_offline_command() -> None:
    shown = {argv[1] for _, argv in EXAMPLES}
    assert {"profiles", "map", "render", "run", "submit"} <= shown, shown


@pytest.mark.parametrize("page, argv", EXAMPLES, ids=[f"{p.name}:{' '.join(a[1:4])}" for p, a in EXAMPLES])
def test_every_hpcring_example_parses(page: Path, argv: list[str]) -> None:
    assert argv[1] in SUBCOMMANDS, f"{page.name}: unknown command in {shlex.join(argv)}"
    subcommand_parser(argv[1]).parse_args(argv[2:])


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
