"""Hostile strings in an MPIJob: command arguments, environment values, working directory and image are
rendered, the manifest is loaded back as the API server would (one YAML document, valid against the CRD),
the kubelet's `$(VAR)` expansion is applied as the pod would see it, and the launcher's command is then run:
a recording `mpirun` and a recording rank command (stand-ins on PATH) see every string exactly as given, and a
canary proves nothing else ran. Hostile job names are refused, never rendered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given
from k8s_helpers import containers, manifest, plan, write_exe
from kubelet import kubelet_expand

from hpcring.errors import ConfigError
from hpcring.schedulers import kubernetes_crd
from hpcring.schedulers.kubernetes_manifest import kube_escape

NASTY = [
    "plain",
    "two words",
    "it's",
    'say "hi"',
    "$(touch {canary})",
    "$(HOME)",
    "$$(HOME)",
    "$(MASTER_ADDR)",
    "`touch {canary}`",
    "; touch {canary}",
    "'; touch {canary}; '",
    "$HOME ${PATH} $$ $1 $",
    "back\\slash\\",
    "line\nbreak; touch {canary}",
    "tab\there",
    "#not a comment",
    "key: value",
    "- item",
    "---\nkind: Pod",
    "{a: b}",
    "&anchor *alias !!python/object:os.system",
    "*.py ?",
    "-x",
    "",
    "ünïcödé ✓",
    "HPCRING_EOF",
]

RECORDER = """#!{python}
import json, os, sys
with open({record!r}, "a") as f:
    f.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
"""


def _sandbox(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.jsonl"
    for tool in ("mpirun", "python3"):
        write_exe(bin_dir / tool, RECORDER.format(python=sys.executable, record=str(record)))
    return bin_dir, record


@pytest.mark.parametrize("raw", NASTY, ids=range(len(NASTY)))
def test_hostile_strings_reach_the_ranks_unchanged(tmp_path: Path, raw: str) -> None:
    canary = tmp_path / "canary"
    payload = raw.replace("{canary}", str(canary))
    p = plan(
        nodes=2,
        command=("python3", payload, f"--opt={payload}"),
        env=(("PAYLOAD", payload), ("OTHER", payload * 2)),
        workdir=f"/work/{payload}",
        image=f"registry.example/{payload}",
    )
    obj = manifest(p)  # exactly one document
    assert kubernetes_crd.errors(obj) == []
    (launcher,) = containers(obj, "Launcher")
    env = {e["name"]: e["value"] for e in launcher["env"]}
    seen_env: dict[str, str] = {}
    for name, value in env.items():  # the kubelet expands each value against those defined before it
        seen_env[name] = kubelet_expand(value, seen_env)
    assert seen_env["PAYLOAD"] == payload and seen_env["OTHER"] == payload * 2
    assert launcher["workingDir"] == f"/work/{payload}"
    for role in ("Launcher", "Worker"):
        assert containers(obj, role)[0]["image"] == f"registry.example/{payload}"
    argv = [kubelet_expand(w, seen_env) for w in launcher["command"]]
    bin_dir, record = _sandbox(tmp_path)
    path = f"{bin_dir}:/usr/bin:/bin"
    subprocess.run(argv, env={"PATH": path}, check=True, timeout=60)
    (mpirun,) = [json.loads(line) for line in record.read_text().splitlines()]
    rank_argv = mpirun["argv"][mpirun["argv"].index("bash") :]
    # What mpirun would start on a worker: the wrapper, then the rank command, as local rank 3.
    subprocess.run(rank_argv, env={"PATH": path, "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, check=True, timeout=60)
    calls: list[dict[str, Any]] = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[1] == {"tool": "python3", "argv": [payload, f"--opt={payload}"], "gpus": "3"}
    assert not canary.exists()


@pytest.mark.parametrize("raw", [n for n in NASTY if n != "plain"], ids=range(len(NASTY) - 1))
def test_hostile_job_names_are_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="cannot name an MPIJob") as info:
        plan(name=raw)
    assert "\n" not in str(info.value).replace(repr(raw), "")


@given(st.text())
def test_kubelet_reads_every_escaped_string_back(text: str) -> None:
    assert kubelet_expand(kube_escape(text), {"HOME": "/root", "A": "x"}) == text
