"""How `hpcring run` and its rank wrappers notice that the other side is gone without a word (issue 27).

A node whose link fails, or that freezes, closes no connection: TCP just stops delivering. So both ends of
every control connection send a heartbeat frame and count the silence since they last heard anything:

- the launcher names a node not heard from for the silence timeout and ends the job (elastic: blacklists it);
- a wrapper that has not heard its launcher for that long ends its rank, itself and the MPI daemon that
  started it (the dead-man switch), so a partitioned node frees its GPUs with nobody reaching it;
- a wrapper whose rank has been stopped (SIGSTOP: state `T`, not a debugger's `t`) for that long ends it;
- a launcher that was itself not running (stopped, or blocked) does not count that time against the nodes: it
  notices its loop came late, and past the silence timeout ends the job naming itself, after printing what
  the ranks sent meanwhile (the wrappers keep sending their output and exit reports into the connection).

The silence timeout is half the collective timeout (HPCRING_COLLECTIVE_TIMEOUT, `--collective-timeout`,
default 300 s; 0 turns both off): a lost node is then named by the launcher before the ranks still running
time out in the collective they were waiting on it for, so the error, and the host an elastic job drops, is
the node and not its victims.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping

from hpcring.config import COLLECTIVE_TIMEOUT_VAR, DEFAULT_COLLECTIVE_TIMEOUT_S, parse_timeout

# Processes of MPI launchers that start ranks (the wrapper's parent): the dead-man switch ends these too.
MPI_DAEMONS = frozenset(
    {"prted", "prterun", "orted", "orterun", "mpirun", "mpiexec", "mpiexec.hydra", "hydra_pmi_proxy"}
)
PARENT_GRACE_S = 2.0


def silence_timeout(settings: Mapping[str, str], env: Mapping[str, str]) -> float:
    """Seconds of silence after which a node (or the launcher) counts as lost: half the collective timeout
    given to the job (its settings, else the launcher's environment, else the default); 0: never."""
    text = settings.get(COLLECTIVE_TIMEOUT_VAR) or env.get(COLLECTIVE_TIMEOUT_VAR, "").strip()
    collective = parse_timeout(COLLECTIVE_TIMEOUT_VAR, text) if text else DEFAULT_COLLECTIVE_TIMEOUT_S
    return collective / 2


def heartbeat_interval(silence_s: float) -> float:
    """How often each side sends a heartbeat: several per silence timeout, at most every 5 s."""
    return min(5.0, max(0.2, silence_s / 5)) if silence_s > 0 else 5.0


def lost_nodes_text(ranks_by_host: Mapping[str, list[int]], silence_s: float) -> str:
    """'node n2 (rank 1) not heard from for 10 s' for each silent host, joined with '; '."""
    parts = []
    for host, ranks in sorted(ranks_by_host.items(), key=lambda item: min(item[1])):
        listed = ",".join(str(r) for r in sorted(ranks))
        parts.append(f"node {host} (rank{'s' if len(ranks) > 1 else ''} {listed})")
    return f"{'; '.join(parts)} not heard from for {silence_s:g} s"


def is_stopped(pid: int) -> bool:
    """True while `pid` is stopped by a signal (/proc state `T`); a traced stop (`t`, a debugger) is not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may itself contain ") ".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"T"


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def mpi_parent() -> int | None:
    """This process's parent when it is an MPI launcher daemon (it started this node's ranks), else None."""
    parent = os.getppid()
    return parent if parent > 1 and _process_name(parent) in MPI_DAEMONS else None


def end_mpi_parent() -> str | None:
    """The dead-man switch's last act: if this process's parent is an MPI launcher daemon (whose own link to
    the launcher is as dead as ours), SIGTERM it, then SIGKILL it after a grace. Returns its name, or None
    when the parent is something else (then it is left alone)."""
    parent = os.getppid()
    name = _process_name(parent)
    if parent <= 1 or name not in MPI_DAEMONS:
        return None
    # The daemon passes SIGTERM on to its children, this wrapper among them: finish the job first.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(parent, signal.SIGTERM)
    deadline = time.monotonic() + PARENT_GRACE_S
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.getppid() == parent:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(parent, signal.SIGKILL)
    return name
