"""Shared by the PBS and Flux tests: golden variants, a derived profile, running a rendered script with the
stand-in batch tools on PATH, and a probe command that reports what each rank was given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from sched_helpers import make_plan, render_plan
from standins import install

from hpcring.schedulers import profile

TRAIN = ("python", "train.py", "--epochs", "3")
# Each rank prints what it got: host, ranks, the CPUs the launcher would bind, its visible GPUs. One write()
# per line: the tasks share the job's output file, and print() under PYTHONUNBUFFERED writes the text and its
# newline separately, so two tasks' lines could interleave.
PROBE = (
    sys.executable,
    "-c",
    "import json, os; os.write(1, ('PROBE ' + json.dumps({k: os.environ.get(k) for k in ('STANDIN_HOST', "
    "'PMI_RANK', 'FLUX_TASK_RANK', 'STANDIN_CPUS', 'CUDA_VISIBLE_DEVICES')}) + '\\n').encode())",
)


def derived_profile(tmp: Path, name: str, **site: Any) -> str:
    """A copy of built-in profile `name` with `site` keys replaced; returns its path."""
    data = yaml.safe_load(profile.source_of(name)[1])
    data["site"].update(site)
    path = tmp / f"{name}-derived.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def tools_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment with the stand-ins first on PATH and their state directory."""
    bin_dir = tmp / "bin"
    install(bin_dir)
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STANDIN_STATE": str(state),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        **extra,
    }


def run_rendered(tmp: Path, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = tmp / "job.sh"
    script.write_text(text)
    return subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp, timeout=120
    )


def probes(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("PROBE ") :]) for line in stdout.splitlines() if line.startswith("PROBE ")]


def calls(env: dict[str, str]) -> list[dict[str, Any]]:
    path = Path(env["STANDIN_STATE"]) / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


__all__ = ["TRAIN", "make_plan", "render_plan"]
