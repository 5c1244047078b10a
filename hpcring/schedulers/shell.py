"""Quoting for generated scripts: shell words, `#SBATCH`/`#BSUB` directive values, and trusted expressions.

Every value that reaches a script goes through one of these functions (as Jinja filters). `Raw` marks the few
strings our own code writes as shell expressions (`"$MASTER_ADDR_CMD"`, `"${TMPDIR:-/tmp}"`): they are never
built from user input.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from hpcring.errors import ConfigError

_BARE = re.compile(r"^[A-Za-z0-9_./:%+,@=-]+$")
# Bash's reserved words: `shlex.quote` leaves them bare (they are safe characters), and bare they are still
# arguments where we write them, but shellcheck takes `then`, `do`... as misplaced keywords (SC1010).
_RESERVED = frozenset(
    [
        "!",
        "case",
        "coproc",
        "do",
        "done",
        "elif",
        "else",
        "esac",
        "fi",
        "for",
        "function",
        "if",
        "in",
        "select",
        "then",
        "time",
        "until",
        "while",
        "{",
        "}",
        "[[",
        "]]",
    ]
)


class Raw(str):
    """A shell expression written by hpcring itself; emitted without quoting."""

    __slots__ = ()


def quote(value: object) -> str:
    r"""One shell word: `shlex.quote`, except for `Raw` expressions, bash's reserved words (quoted, so no
    reader takes them for keywords) and words holding a backslash.

    `shlex.quote("a" + "\\")` is `'a\'`: right for bash, but shellcheck reads a backslash before a closing
    quote as an attempt to escape it (SC1003). Such words are quoted piece by piece instead: the text between
    single quotes in single quotes, each quote as `\'` and the backslashes that end a piece as `\\`, outside.
    """
    if isinstance(value, Raw):
        return str(value)
    text = str(value)
    if text in _RESERVED:
        return f"'{text}'"
    if "\\" not in text:
        return shlex.quote(text)
    out = []
    for i, piece in enumerate(text.split("'")):
        if i:
            out.append("\\'")
        body = piece.rstrip("\\")
        if body:
            out.append(shlex.quote(body))
        out.append("\\\\" * (len(piece) - len(body)))
    return "".join(out)


def join(words: Iterable[object]) -> str:
    """A command line from words, each quoted with `quote`."""
    return " ".join(quote(w) for w in words)


def export(name: str, value: object) -> str:
    """Set and export one variable of the job's environment.

    A literal value is exported where it is assigned (`export NAME='it'"'"'s'`): assigned first and exported
    later, a value holding a quote or backslash makes shellcheck warn (SC2089 at the assignment, SC2090 at
    the `export`) that the quotes would be literal if the variable were expanded as a command, which the
    script never does, yet the warning is right about the shape. A `Raw` command substitution stays assigned
    first and exported after (`export NAME="$(cmd)"` would hide cmd's failure from `set -e`, SC2155).
    """
    if not name.isidentifier() or not name.isascii():
        raise ConfigError(f"environment variable name {name!r} is not valid; use letters, digits and '_'")
    if isinstance(value, Raw):
        return f"{name}={value}\nexport {name}"
    return f"export {name}={quote(value)}"


_LINE_BREAKS = {
    "\n": "a newline",
    "\r": "a carriage return",
    "\0": "a NUL byte",
    # Other characters that editors and Python's splitlines() treat as line ends: refused too, so that no tool
    # reading the script can see a directive line end early.
    **{ch: f"a line-breaking character {ch!r}" for ch in "\v\f\x1c\x1d\x1e\x85\u2028\u2029"},
}


def check_line_safe(value: str, what: str, prefix: str = "directive") -> str:
    """Refuse characters that would end a directive line (and NUL, which no file name or argument can
    hold); `prefix` is the scheduler's own directive (`#SBATCH`, `#PBS`, ...), which the message names."""
    for ch, name in _LINE_BREAKS.items():
        if ch in value:
            raise ConfigError(
                f"{what} {value!r} contains {name}; it would end the {prefix} line and could start a "
                "new directive. Remove it."
            )
    return value


def directive_value(value: object) -> str:
    """A value on a `#SBATCH`/`#BSUB` line: bare when plain, else double-quoted with `\\` and `"` escaped.

    sbatch reads these lines itself (not through a shell): it honours double quotes and backslash escapes, and
    an unquoted `#` starts a comment. Double quotes with escapes survive that parser and LSF's alike.
    """
    text = check_line_safe(str(value), "value")
    if _BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_directive_value(text: str) -> str:
    """Inverse of `directive_value` following sbatch's argument parser (used by tests to prove the round
    trip)."""
    out, q, esc = [], "", False
    for ch in text:
        if esc:
            out.append(ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif q:
            if ch == q:
                q = ""
            else:
                out.append(ch)
        elif ch in "\"'":
            q = ch
        elif ch == "#" or ch.isspace():
            break
        else:
            out.append(ch)
    return "".join(out)
