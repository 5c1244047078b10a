"""`--help` as a user reads it: what the tool does, and examples that are real commands.

Every example printed by `hpcring --help` and `hpcring COMMAND --help` is parsed by that command's own parser
here, so an example cannot drift from the flags it shows.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from hpcring.cli import SUBCOMMANDS, build_parser, subcommand_parser


def _help(*argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcring", *argv, "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _examples(text: str) -> list[list[str]]:
    """The command lines under 'examples:' in a help text."""
    after = text.split("examples:\n", 1)[1]
    lines = [ln.strip() for ln in after.splitlines() if ln.startswith("  ")]
    return [shlex.split(ln) for ln in lines]


def _parse(argv: list[str]) -> None:
    assert argv[0] == "hpcring" and argv[1] in SUBCOMMANDS, argv
    subcommand_parser(argv[1]).parse_args(argv[2:])


def test_top_level_help_says_what_the_tool_does_with_examples() -> None:
    text = _help()
    assert "PyTorch" in text and "Horovod" in text and "job scripts" in text
    assert "module" not in text and "imported" not in text  # no implementation notes for users
    for name in SUBCOMMANDS:
        assert f"    {name} " in text, name
    examples = _examples(text)
    assert examples
    for argv in examples:
        _parse(argv)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_help_has_a_description_and_valid_examples(name: str) -> None:
    text = _help(name)
    assert text.startswith(f"usage: hpcring {name}")
    assert SUBCOMMANDS[name].summary[1:] in " ".join(text.split())  # the description, capitalised
    examples = _examples(text)
    assert examples, f"hpcring {name} --help shows no example"
    for argv in examples:
        if argv[:2] == ["hpcring", "run"] and "--" in argv:
            inner = argv[argv.index("--") + 1 :]
            if inner[:3] == ["python", "-m", "hpcring"]:
                _parse(["hpcring", *inner[3:]])  # the command each rank runs is an hpcring command too
        _parse(argv)


def test_bench_allreduce_help_describes_the_benchmark() -> None:
    text = _help("bench", "allreduce")
    assert "raw mpi4py Allreduce" in text and "HPCRING_BENCH_" in text
    for argv in _examples(text):
        if argv[:2] == ["hpcring", "run"]:
            argv = ["hpcring", *argv[argv.index("--") + 4 :]]
        _parse(argv)


def test_unknown_command_lists_the_valid_ones() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcring", "frobnicate"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert all(name in proc.stderr for name in SUBCOMMANDS), proc.stderr
    assert build_parser().prog == "hpcring"
