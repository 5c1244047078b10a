"""Shared by the stand-in batch tools: job records in $STANDIN_STATE, the call log, running a job script in
the background the way a batch server does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def state_dir() -> Path:
    return Path(os.environ["STANDIN_STATE"])


def log_call(tool: str, argv: list[str]) -> None:
    """Every call, in order, for tests that check exactly what ran."""
    with open(state_dir() / "calls.jsonl", "a") as f:
        f.write(json.dumps({"tool": tool, "argv": argv}) + "\n")


def next_seq() -> int:
    path = state_dir() / "seq"
    seq = int(path.read_text()) + 1 if path.exists() else 1234
    path.write_text(str(seq))
    return seq


def job_path(job_id: str) -> Path:
    return state_dir() / f"job-{job_id.encode().hex()}.json"


def save_job(job: dict[str, Any]) -> None:
    tmp = job_path(job["id"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(job))
    tmp.replace(job_path(job["id"]))


def load_job(job_id: str) -> dict[str, Any] | None:
    path = job_path(job_id)
    return json.loads(path.read_text()) if path.exists() else None


def all_jobs() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(state_dir().glob("job-*.json"))]


def start_background(tool: str, job_id: str) -> None:
    """Run `tool.py --run JOB_ID` detached: the job outlives the submit command, as on a real server."""
    here = Path(__file__).resolve().parent
    subprocess.Popen(
        [sys.executable, str(here / f"{tool}.py"), "--run", job_id],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_script(
    script: str,
    env: dict[str, str],
    cwd: str,
    out: str,
    err: str | None,
    signal_after: tuple[int, float] | None = None,
) -> int:
    """bash SCRIPT with its output in the job's files; the status as the shell would report it.
    `signal_after`: (signal, seconds): send the script that signal once it has run that long (a
    scheduler's warning before the time limit)."""
    with open(out, "ab") as fo, open(err or out, "ab") as fe:
        proc = subprocess.Popen(["bash", script], env=env, cwd=cwd, stdout=fo, stderr=fe)
        if signal_after is not None:
            try:
                proc.wait(timeout=signal_after[1])
            except subprocess.TimeoutExpired:
                proc.send_signal(signal_after[0])
        return proc.wait()


def cpu_list(text: str) -> list[int]:
    """ "0-3,8" -> [0, 1, 2, 3, 8]."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def format_cpus(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def run_tasks(tasks: list[tuple[list[str], dict[str, str]]]) -> int:
    """Start every task at once, wait for all, and return the highest status (128+signal when killed), as
    parallel launchers do."""
    procs = [subprocess.Popen(argv, env=env) for argv, env in tasks]
    worst = 0
    for p in procs:
        rc = p.wait()
        worst = max(worst, 128 - rc if rc < 0 else rc)
    return worst


def die(tool: str, message: str, code: int = 2) -> None:
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(code)
