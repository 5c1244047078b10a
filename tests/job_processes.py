"""Reading processes from /proc for the launcher tests (imported as `job_processes`): who carries a secret on
its command line, what a process's environment holds, which processes live in a fake node's namespace.

Every process of this machine is read, not only the job's: a secret must not show up in anyone's argv, and
in one PID namespace (the fake cluster's nodes share it) the job's remote daemons are among them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcring.launch.protocol import TOKEN_VARIABLE

WRAPPER = b"hpcring.launch.rankwrap"


def cmdlines() -> dict[int, bytes]:
    """Every readable process's argv, NUL-separated as the kernel keeps it."""
    out: dict[int, bytes] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
    return out


def environ(pid: int) -> dict[str, str]:
    """The environment `pid` was started with (as /proc shows it: only its user and root can read it)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def argv_holders(secret: str) -> dict[int, str]:
    """Processes whose argv contains `secret`, with their command lines (readable)."""
    needle = secret.encode()
    return {
        pid: line.replace(b"\0", b" ").decode(errors="replace")
        for pid, line in cmdlines().items()
        if needle in line
    }


def with_argv(fragment: str) -> list[int]:
    """Processes whose argv contains `fragment` (this test process excluded)."""
    needle = fragment.encode()
    return sorted(pid for pid, line in cmdlines().items() if needle in line and pid != os.getpid())


def children(pid: int) -> list[int]:
    """Direct children of `pid`."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def netns_pids(node: str) -> list[int]:
    """Processes running in fake node `node`'s network namespace (`ip netns pids`)."""
    out = subprocess.run(
        ["ip", "netns", "pids", node], capture_output=True, text=True, timeout=30, check=False
    )
    return [int(p) for p in out.stdout.split()]


def describe(pids: list[int]) -> str:
    """`pid: argv` lines for an assertion message."""
    lines = {pid: line.replace(b"\0", b" ").decode(errors="replace") for pid, line in cmdlines().items()}
    return "\n".join(f"{p}: {lines.get(p, '?')}" for p in pids)


def is_wrapper(cmdline: bytes) -> bool:
    """`python -m hpcring.launch.rankwrap ...` (mpiexec's own argv names the module too, further on)."""
    return cmdline.split(b"\0")[1:3] == [b"-m", WRAPPER]


def check_secret(launcher: int, np: int, rank_pids: Sequence[int], marker: str) -> str:
    """The token of the job run by `launcher` (the `hpcring run` process): in mpiexec's environment and in
    each of the np wrappers' (found by `marker`, a job-unique word of the ranks' command), in no rank's, and
    on no process's command line. Returns it."""
    lines = cmdlines()
    mpiexec = children(launcher)
    assert len(mpiexec) == 1, describe(mpiexec)
    token = environ(mpiexec[0]).get(TOKEN_VARIABLE, "")
    assert re.fullmatch(r"[0-9a-f]{32}", token), f"no job token in mpiexec's environment: {token!r}"
    holders = argv_holders(token)
    assert not holders, "the job's secret is on these command lines:\n" + "\n".join(
        f"{p}: {line}" for p, line in holders.items()
    )
    wrappers = [p for p, line in lines.items() if is_wrapper(line) and marker.encode() in line]
    assert len(wrappers) == np, describe(wrappers)
    assert all(environ(w).get(TOKEN_VARIABLE) == token for w in wrappers), "wrappers lack the token"
    for pid in rank_pids:
        assert TOKEN_VARIABLE not in environ(pid), f"rank process {pid} inherited the job's secret"
    return token
