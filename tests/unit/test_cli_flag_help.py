"""Every flag's help explains itself in one form: what it does, then its default where it has one, then its
environment twin(s) in brackets at the end (`... ; default 120 [HPCRING_START_TIMEOUT]`).

The twins are the variables that really set the flag's default (found by setting each, as the reference
generator does), so the bracket cannot name a variable the code does not read.
"""

from __future__ import annotations

import argparse
import re

import pytest
from test_docs_cli import _build, _env_twins, _environment, _parsers

from hpcring.cli import SUBCOMMANDS, subcommand_parser

_VAR = r"(?:HPCRING|HOROVOD)_[A-Z0-9_]+"
_TAIL = re.compile(rf"\s\[({_VAR}(?:, {_VAR})*)\]$")
_ANY_VAR = re.compile(rf"\b{_VAR}")


def _flags() -> list[tuple[str, int, argparse.Action]]:
    out = []
    for name, sub in SUBCOMMANDS.items():
        with _environment({}):
            parsers = list(_parsers(f"hpcring {name}", subcommand_parser(name), sub.summary))
        for command, parser, _ in parsers:
            for index, action in enumerate(parser._actions):
                if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                if action.help != argparse.SUPPRESS:  # hidden: horovodrun's refused flags, named in cli.md
                    out.append((command, index, action))
    return out


FLAGS = _flags()


def _id(flag: tuple[str, int, argparse.Action]) -> str:
    command, _, action = flag
    return f"{command} {(action.option_strings or [action.dest])[-1]}"


@pytest.mark.parametrize("flag", FLAGS, ids=[_id(f) for f in FLAGS])
def test_flag_help_explains_with_default_and_twin(flag: tuple[str, int, argparse.Action]) -> None:
    command, index, action = flag
    text = action.help or ""
    tail = _TAIL.search(text)
    words = re.findall(r"[A-Za-z]{2,}", _TAIL.sub("", text))
    assert len(words) >= 4, f"{_id(flag)}: its help does not say what it does: {text!r}"
    twins = _env_twins(command, index, action)
    if twins:
        assert tail is not None and sorted(tail.group(1).split(", ")) == sorted(twins), (
            f"{_id(flag)}: help must end with [{', '.join(twins)}]: {text!r}"
        )
    body = _TAIL.sub("", text)
    assert not _ANY_VAR.search(body.replace("HPCRING_PROFILE_PATH", "")), (
        f"{_id(flag)}: variables belong in the closing brackets only: {text!r}"
    )
    with _environment({}):
        default = _build(command)._actions[index].default
    if action.nargs != 0 and default not in (None, False, [], "", ()):
        assert "default" in text, f"{_id(flag)}: its default {default!r} is not in its help: {text!r}"
