"""The job script: a Plan formatted by its scheduler's Jinja2 template (StrictUndefined, quoting filters).

The templates live at the top of the repository (`slurm/`, `lsf/`, `pbs/`, `flux/`, `singularity/`, where site
admins look for them) and ship in the wheel through the `hpcring/schedulers/templates/<dir>` links; the loader
looks in the installed package first, then in the source tree, so both layouts work.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

from hpcring.errors import HpcringError
from hpcring.schedulers import shell
from hpcring.schedulers.plan import Directive, Plan

_HEREDOC = "HPCRING_EOF"


def template_roots() -> list[Path]:
    """Directories holding the template folders: the package's copy, then the source tree's."""
    here = Path(__file__).resolve().parent
    candidates = [here / "templates", here.parent.parent]
    roots = [c for c in candidates if (c / "slurm" / "job.sh.j2").is_file()]
    if not roots:
        raise HpcringError(f"job script templates not found (looked in {', '.join(map(str, candidates))})")
    return roots


def _directive(d: Directive) -> str:
    if d.value is None:
        return d.flag
    return f"{d.flag}{d.sep}{shell.directive_value(d.value)}"


def _comment(value: object) -> str:
    """Text for a `#` comment line: line breaks become spaces, so a value can never leave its comment."""
    return " ".join(str(value).splitlines())


def _heredoc(content: str) -> str:
    if any(line == _HEREDOC for line in content.splitlines()):
        raise HpcringError("inline file content contains the here-document delimiter")
    return content.rstrip("\n")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(r) for r in template_roots()]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell.quote
    env.filters["shjoin"] = shell.join
    env.filters["export"] = shell.export
    env.filters["directive"] = _directive
    env.filters["heredoc"] = _heredoc
    env.filters["comment"] = _comment
    env.globals["HEREDOC"] = _HEREDOC
    return env


def render(plan: Plan) -> str:
    """The job script for `plan`."""
    return environment().get_template(plan.template).render(plan=plan)
