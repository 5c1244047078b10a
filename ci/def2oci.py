#!/usr/bin/env python3
"""Convert an Apptainer/Singularity definition file (`.def`) into a podman/buildah build context.

Why our own: no Apptainer or Singularity binary can be installed on CI, so the only way to *run* what a
`.def` builds is to rebuild it with podman. spython's converter splits `%post` into one `RUN` per line (losing
`set -e`, `cd` and every `if`/`for` block) and silently drops sections it does not know. This converter lays
the image out the way `apptainer build` does, so `podman run` behaves like `apptainer run/exec/test`:

    header `From:`   -> FROM (Bootstrap: docker or docker-daemon; the image name is used as given)
    %arguments       -> `{{ NAME }}` substituted everywhere (defaults, overridden by --arg, as --build-arg)
    %labels          -> LABEL
    %files           -> COPY (sources relative to --base-dir, as apptainer reads them relative to its cwd)
    %post            -> ONE script, run with `sh -ex` (or the section's `-c INTERPRETER`) as root
    %environment     -> /.singularity.d/env/90-environment.sh
    %runscript       -> /.singularity.d/runscript          %test -> /.singularity.d/test
    %help            -> /.singularity.d/runscript.help     the .def itself -> /.singularity.d/Singularity
    actions          -> /.singularity.d/actions/{run,exec,test}: source env/*.sh in order, then run the
                        runscript / the given command / the test, exactly like apptainer's action scripts
    ENTRYPOINT       -> actions/run, so `podman run IMG ARGS` is `apptainer run IMG ARGS`; use
                        `--entrypoint /.singularity.d/actions/exec` for `apptainer exec`,
                        `--entrypoint /.singularity.d/actions/test` for `apptainer test`

Sections that have no podman equivalent are rejected with the line and the reason rather than dropped:
%setup (runs on the build host), %startscript (instances), app sections (SCIF), multi-stage files, other
bootstrap agents and header keys. Section names, header keys and placeholders are checked by defcheck.py's
parser (shellcheck is defcheck's job, not this one's).

usage: def2oci.py [--arg NAME=VALUE]... [--base-dir DIR] [--run-as USER] FILE.def OUTDIR
then:  podman build -f OUTDIR/Containerfile -t NAME OUTDIR
exit status: 0 written, 1 the .def cannot be converted (messages say where and why), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import defcheck  # ci/defcheck.py, beside this file

CONVERTIBLE = frozenset({"arguments", "labels", "files", "post", "environment", "runscript", "test", "help"})
WHY_NOT = {
    "setup": "runs on the build host, outside the image; do that work before the build or in %post",
    "startscript": "instances (`apptainer instance start`) have no podman-build equivalent",
}
AGENTS = frozenset({"docker", "docker-daemon"})
GLOB = re.compile(r"[*?\[]")

# Apptainer's action scripts, reduced to what they do for an image: source the environment files in order
# (docker ENV first, then %environment), then run. The shebang is /bin/sh, as apptainer's.
SOURCE_ENV = (
    'for script in /.singularity.d/env/*.sh; do\n    if [ -f "$script" ]; then . "$script"; fi\ndone\n'
)
ACTIONS = {
    "run": SOURCE_ENV + "if [ -x /.singularity.d/runscript ]; then\n"
    '    exec /.singularity.d/runscript "$@"\nfi\n'
    'echo "no runscript in this image: use the exec action" >&2\nexit 1\n',
    "exec": SOURCE_ENV + 'exec "$@"\n',
    "test": SOURCE_ENV + "if [ -x /.singularity.d/test ]; then\n"
    '    exec /.singularity.d/test "$@"\nfi\n'
    'echo "no %test section in this image" >&2\nexit 0\n',
}


class ConversionError(Exception):
    """The .def uses something podman cannot reproduce; `problems` are `FILE:LINE: message` lines."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass
class Context:
    """What goes into OUTDIR: Containerfile lines and files (relative path -> (text or source path, mode))."""

    lines: list[str] = field(default_factory=list)
    texts: dict[str, tuple[str, int]] = field(default_factory=dict)
    copies: dict[str, Path] = field(default_factory=dict)


def body_text(sec: defcheck.Section, values: dict[str, str], path: str, errors: list[str]) -> str:
    """A section's body with `{{ NAME }}` substituted; lines are kept as written (heredocs stay intact)."""
    lines = [defcheck.substitute(text, number, values, path, errors) for number, text in sec.body]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def interpreter(sec: defcheck.Section, path: str, errors: list[str]) -> str:
    """`-c /bin/bash` after a section name picks its interpreter; nothing else may follow the name."""
    if not sec.args:
        return "/bin/sh"
    match = re.fullmatch(r"-c\s+(/\S+)", sec.args)
    if match is None:
        errors.append(f"{path}:{sec.line}: %{sec.name} {sec.args!r}: only '-c /ABSOLUTE/SHELL' is supported")
        return "/bin/sh"
    return match.group(1)


def check_convertible(stages: list[defcheck.Stage], path: str, errors: list[str]) -> defcheck.Stage | None:
    """The single stage to convert, after reporting what it uses that has no podman equivalent."""
    defcheck_errors: list[str] = []
    for stage in stages:
        defcheck.check_header(stage, path, defcheck_errors)
        defcheck.check_sections(stage, path, defcheck_errors)
    errors += defcheck_errors
    if len(stages) > 1:
        line = next((s.header["bootstrap"][0] for s in stages[1:] if "bootstrap" in s.header), 1)
        errors.append(f"{path}:{line}: multi-stage .def files are not supported; build the stages separately")
        return None
    stage = stages[0]
    agent_line, agent = stage.header.get("bootstrap", (1, ""))
    if agent and agent.lower() not in AGENTS and not defcheck_errors:
        allowed = ", ".join(sorted(AGENTS))
        errors.append(f"{path}:{agent_line}: 'Bootstrap: {agent}' cannot be converted; allowed: {allowed}")
    for key, (line, _) in stage.header.items():
        if key not in ("bootstrap", "from"):
            errors.append(f"{path}:{line}: header key {key!r} is not supported; allowed: Bootstrap, From")
    for sec in stage.sections:
        if sec.name in CONVERTIBLE or sec.name not in defcheck.KNOWN_SECTIONS:
            continue  # unknown names were reported by defcheck's check_sections
        why = WHY_NOT.get(sec.name, "app sections (SCIF) have no podman equivalent")
        errors.append(f"{path}:{sec.line}: %{sec.name} cannot be converted: {why}")
    return stage


def add_files(ctx: Context, sec: defcheck.Section, base: Path, path: str, errors: list[str]) -> None:
    """%files `SRC [DEST]` -> SRC copied into the context plus a COPY; DEST defaults to SRC (as apptainer)."""
    if sec.args:
        errors.append(f"{path}:{sec.line}: '%files {sec.args}' (files from another stage) is not supported")
        return
    for number, text in sec.body:
        words = text.split()
        if not words or words[0].startswith("#"):
            continue
        src, dest = words[0], words[-1]
        if GLOB.search(src):
            errors.append(f"{path}:{number}: %files source {src!r}: globs are not supported; name each path")
            continue
        source = base / src
        if not source.exists():
            errors.append(f"{path}:{number}: %files source {src!r} not found under {base}")
            continue
        if not dest.startswith("/"):
            dest = "/" + dest.lstrip("./")
        staged = f"files/{len(ctx.copies)}/{source.name}"
        ctx.copies[staged] = source
        ctx.lines.append(f"COPY {json.dumps([staged, dest])}")


def convert(def_path: Path, given: dict[str, str], base: Path, run_as: str | None) -> Context:
    """The build context for one .def, or ConversionError listing every problem found."""
    path = str(def_path)
    errors: list[str] = []
    text = def_path.read_text(encoding="utf-8")
    stages = defcheck.parse(text.splitlines(), path, errors)
    values = defcheck.declared_arguments(stages, given)
    stage = check_convertible(stages, path, errors)
    if stage is None or errors:
        raise ConversionError(errors)
    from_line, image = stage.header["from"]
    image = defcheck.substitute(image, from_line, values, path, errors)
    sections = {sec.name: sec for sec in stage.sections}
    ctx = Context(lines=[f"# Generated by ci/def2oci.py from {def_path.name}: do not edit.", f"FROM {image}"])
    for number, line in sections["labels"].body if "labels" in sections else []:
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#"):
            value = defcheck.substitute(value.strip(), number, values, path, errors)
            ctx.lines.append(f"LABEL {json.dumps(key)}={json.dumps(value, ensure_ascii=False)}")
    # Apptainer builds as root whatever the source image's USER; --run-as restores an unprivileged user.
    ctx.lines.append("USER 0")
    if "files" in sections:
        add_files(ctx, sections["files"], base, path, errors)
    sd = "singularity.d"
    ctx.texts[f"{sd}/Singularity"] = (text, 0o644)
    ctx.texts[f"{sd}/env/90-environment.sh"] = (
        "#!/bin/sh\n# %environment, sourced by every action\n"
        + (body_text(sections["environment"], values, path, errors) if "environment" in sections else ""),
        0o755,
    )
    for name, target in (("runscript", "runscript"), ("test", "test")):
        if name in sections:
            shell = interpreter(sections[name], path, errors)
            body = body_text(sections[name], values, path, errors)
            ctx.texts[f"{sd}/{target}"] = (f"#!{shell}\n{body}", 0o755)
    if "help" in sections:
        ctx.texts[f"{sd}/runscript.help"] = (body_text(sections["help"], values, path, errors), 0o644)
    for action, script in ACTIONS.items():
        ctx.texts[f"{sd}/actions/{action}"] = ("#!/bin/sh\n" + script, 0o755)
    ctx.lines.append(f"COPY {sd} /.singularity.d")
    if "post" in sections:
        shell = interpreter(sections["post"], path, errors)
        ctx.texts["post.sh"] = (body_text(sections["post"], values, path, errors), 0o644)
        # apptainer runs %post with `-e -x`: the first failing command fails the build, each is echoed.
        flags = " -ex" if Path(shell).name in ("sh", "bash", "dash", "ksh", "zsh") else ""
        ctx.lines.append("COPY post.sh /.singularity.d/post.sh")
        ctx.lines.append(f"RUN {shell}{flags} /.singularity.d/post.sh && rm /.singularity.d/post.sh")
    if run_as:
        ctx.lines.append(f"USER {run_as}")
    ctx.lines.append('ENTRYPOINT ["/.singularity.d/actions/run"]')
    ctx.lines.append("CMD []")  # the source image's CMD would become the runscript's arguments
    if errors:
        raise ConversionError(errors)
    return ctx


def write(ctx: Context, out: Path) -> None:
    """Write the Containerfile, the generated files (with their modes) and the staged %files sources."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("singularity.d", "files", "post.sh"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for rel, (text, mode) in ctx.texts.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        target.chmod(mode)
    for rel, source in ctx.copies.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)
    (out / "Containerfile").write_text("\n".join(ctx.lines) + "\n", encoding="utf-8")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("deffile", type=Path, metavar="FILE.def")
    parser.add_argument("outdir", type=Path, metavar="OUTDIR")
    parser.add_argument(
        "--arg", action="append", default=[], metavar="NAME=VALUE", help="build argument value"
    )
    parser.add_argument(
        "--base-dir", type=Path, default=Path.cwd(), help="%%files sources are relative to it (default: cwd)"
    )
    parser.add_argument(
        "--run-as",
        metavar="USER[:GROUP]",
        help="final USER of the image (apptainer runs as the calling user; default: root)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    given = defcheck.build_args(args.arg, "def2oci")
    if given is None:
        return 2
    if not args.deffile.is_file():
        print(f"def2oci: {args.deffile}: no such file", file=sys.stderr)
        return 2
    try:
        ctx = convert(args.deffile, given, args.base_dir, args.run_as)
    except ConversionError as exc:
        print("\n".join(sorted(exc.problems, key=defcheck._line_of)), file=sys.stderr)
        return 1
    write(ctx, args.outdir)
    print(f"{args.outdir}/Containerfile: FROM {ctx.lines[1].split(' ', 1)[1]}, {len(ctx.lines)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
