"""How `--help` reads: prose wrapped to the terminal, example commands kept exactly as written."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence


class HelpFormatter(argparse.HelpFormatter):
    """Wraps prose to the terminal and keeps indented lines (the examples) exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = [
            indent + line
            if not line or line.startswith("  ")
            else textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
            for line in text.splitlines()
        ]
        return "\n".join(lines)


def epilog(examples: Sequence[str]) -> str:
    """An `examples:` section, one indented command a line."""
    return "examples:\n" + "\n".join(f"  {e}" for e in examples)
