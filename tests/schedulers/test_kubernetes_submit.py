"""`hpcring submit` for a kubernetes profile: refused (exit 2, one line) without kubectl on PATH or without a
current context, run as a real process with a real PATH; the kubectl command lines it runs, checked with a
small recording `kubectl` this test writes (no Kubernetes can run on these machines)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_helpers import PROFILE, write_exe

from hpcring.schedulers import kubernetes_crd

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--profile", PROFILE, "--nodes", "2", "--image", "img:1", "--job-name", "train"]
REAL_KUBECTL = shutil.which("kubectl")


def _hpcring(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "hpcring", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _path_without_kubectl() -> str:
    """This machine's PATH less the directories holding a kubectl."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "kubectl").exists())


def _one_line_refusal(res: subprocess.CompletedProcess[str], text: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and text in lines[0], lines
    assert res.stdout == ""


def test_refused_without_kubectl_on_the_real_path(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_kubectl(), "HOME": str(tmp_path)}
    res = _hpcring(["submit", *JOB, "--", "python", "train.py"], env, tmp_path)
    _one_line_refusal(res, "kubectl not found on PATH")
    assert not (tmp_path / "hpcring-jobs").exists()  # refused before writing anything


def test_refused_in_a_kubectl_free_environment(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    res = _hpcring(["submit", *JOB, "--", "python", "train.py"], {"PATH": str(empty)}, tmp_path)
    _one_line_refusal(res, "kubectl not found on PATH")


def test_dry_run_needs_no_kubectl(tmp_path: Path) -> None:
    env = {"PATH": _path_without_kubectl(), "HOME": str(tmp_path)}
    res = _hpcring(["submit", *JOB, "--dry-run", "-o", "job.yaml", "--", "python", "train.py"], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"# would run: kubectl apply -f {tmp_path / 'job.yaml'}" in res.stdout
    assert not (tmp_path / "job.yaml").exists()


@pytest.mark.skipif(REAL_KUBECTL is None, reason="no kubectl installed on this machine")
def test_refused_without_a_current_context_by_the_real_kubectl(tmp_path: Path) -> None:
    """The real kubectl with an empty kubeconfig: it has no current context, and submit says so."""
    assert REAL_KUBECTL is not None
    config = tmp_path / "kubeconfig"
    config.write_text("")
    env = {"PATH": str(Path(REAL_KUBECTL).parent), "HOME": str(tmp_path), "KUBECONFIG": str(config)}
    res = _hpcring(["submit", *JOB, "--", "python", "train.py"], env, tmp_path)
    _one_line_refusal(res, "kubectl has no current context")


FAKE = """#!{python}
# Stand-in written by the test: records its argv, answers as kubectl does. Used only to check the argv.
import json, os, shutil, sys
rec = {rec!r}
args = sys.argv[1:]
with open(rec + "/calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["config", "current-context"]:
    print("test-context")
elif args[:2] == ["apply", "-f"]:
    shutil.copy(args[2], rec + "/applied.yaml")
    print("mpijob.kubeflow.org/train created")
elif args[:2] == ["get", "mpijob"]:
    n = len([1 for line in open(rec + "/calls.jsonl") if '"get"' in line])
    conds = [{{"type": "Created", "status": "True"}}, {{"type": "Running", "status": "True"}}]
    if n >= 2:
        end = os.environ["FAKE_END"]
        conds.append({{"type": end, "status": "True", "reason": "MPIJob" + end}})
    print(json.dumps({{"kind": "MPIJob", "status": {{"conditions": conds}}}}))
else:
    sys.exit(9)
"""


@pytest.mark.parametrize(("end", "code"), [("Succeeded", 0), ("Failed", 1)])
def test_submit_wait_runs_kubectl_apply_then_polls_the_mpijob(tmp_path: Path, end: str, code: int) -> None:
    """A recording stand-in `kubectl`, written here, checks only the exact argv hpcring runs and that the
    applied file is the validated manifest; the job's end comes from the MPIJob's conditions."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = write_exe(bin_dir / "kubectl", FAKE.format(python=sys.executable, rec=str(tmp_path)))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_END": end}
    args = ["submit", *JOB, "-o", "out/job.yaml", "--wait", "--poll", "0.05", "--", "python", "train.py"]
    res = _hpcring(args, env, tmp_path)
    assert res.returncode == code, res.stderr
    assert res.stdout.strip() == "train"
    assert f"MPIJob train ended: {end} (MPIJob{end}), exit code {code}" in res.stderr
    manifest = tmp_path / "out" / "job.yaml"
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    get = ["get", "mpijob", "train", "--output", "json"]
    assert calls == [["config", "current-context"], ["apply", "-f", str(manifest)], get, get]
    applied = yaml.safe_load((tmp_path / "applied.yaml").read_text())
    assert applied == yaml.safe_load(manifest.read_text())
    assert kubernetes_crd.errors(applied) == []
    assert kubectl.exists()


def test_namespace_of_the_profile_reaches_kubectl_get(tmp_path: Path) -> None:
    from hpcring.schedulers import kubernetes_jobs
    from hpcring.schedulers.jobstate import Active

    assert kubernetes_jobs.get_argv("kubectl", "train", "ml") == [
        "kubectl",
        "get",
        "mpijob",
        "train",
        "--namespace",
        "ml",
        "--output",
        "json",
    ]
    running = json.dumps({"status": {"conditions": [{"type": "Running", "status": "True"}]}})
    assert kubernetes_jobs.state("train", running) == Active("Running", "running")
    done = json.dumps({"status": {"conditions": [{"type": "Failed", "status": "False"}]}})
    # a condition that is not true ends nothing: the job is still only created
    assert kubernetes_jobs.state("train", done) == Active("Created", "pending")
