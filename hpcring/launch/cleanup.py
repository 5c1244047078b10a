"""Nothing of a job is left on a node, however it ends (issue 35): session directories and shared memory.

MPI launchers and libraries leave files when they do not end cleanly: Open MPI's PRRTE its session directory
(`$TMPDIR/ompi.<pid>`) and the sm transport's segments (`/dev/shm/sm_segment.*`), MPICH its shared memory
(`/dev/shm/mpich_shm_*`), hpcring's shm allreduce a segment between its creation and its unlink. On a shared
node these pile up until /dev/shm is full. Two guards, one per owner:

- the launcher gives mpiexec a per-job TMPDIR (and, on one machine, Open MPI a per-job segment directory
  under /dev/shm) that it removes at the end; the ranks get the user's TMPDIR back (`rank_environment`);
- every rank wrapper notes the shared-memory files its rank maps (/proc/PID/maps: at once, after 1, 3, 7
  and 15 s, then every 8 s, and before it ends the rank) and tells the launcher; once the rank has ended it
  unlinks those that no other rank of its node still maps, and the launcher unlinks what its own machine's
  wrappers reported once mpiexec is gone (an MPI launcher may SIGKILL wrappers before they could). When the
  launcher died (SIGKILL), the wrappers, its last survivors, also remove the per-job directories of its host
  once they have ended the MPI daemon (liveness.end_mpi_parent). A remote node's wrappers sweep its shared
  memory too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping

JOB_PREFIX = "hpcring-job-"
JOB_DIRS = "HPCRING_JOB_DIRS"  # the per-job directories (os.pathsep-separated), for the wrappers
JOB_HOST = "HPCRING_JOB_HOST"  # where they are (hydra passes them to remote ranks too; a shared /tmp)
USER_TMPDIR = "HPCRING_USER_TMPDIR"  # the TMPDIR to give the ranks back ("" when there was none)
SHM_ROOTS = ("/dev/shm",)
# Only files that MPI libraries and hpcring create for one job: a rank may also map a user's own file there.
TRANSIENT = ("sm_segment.", "vader_segment.", "mpich_shm_", "hpcring-")
SIBLING_WAIT_S = 1.0
SAMPLE_FIRST_S, SAMPLE_MOST_S = 1.0, 8.0  # reading a rank's maps takes the kernel 0.2-2 ms: back off


class JobDirs:
    """The launcher's per-job directories and the environment that points mpiexec at them."""

    def __init__(self, base_env: Mapping[str, str], *, openmpi: bool, local: bool) -> None:
        self.user_tmpdir = base_env.get("TMPDIR", "")
        base = self.user_tmpdir if os.path.isdir(self.user_tmpdir) else tempfile.gettempdir()
        self.tmp = tempfile.mkdtemp(prefix=JOB_PREFIX, dir=base)
        self.shm: str | None = None
        self.env = {"TMPDIR": self.tmp, USER_TMPDIR: self.user_tmpdir}
        backing = "OMPI_MCA_btl_sm_backing_directory"
        if openmpi and local and backing not in base_env and os.access(SHM_ROOTS[0], os.W_OK):
            self.shm = tempfile.mkdtemp(prefix=JOB_PREFIX, dir=SHM_ROOTS[0])
            self.env[backing] = self.shm
        self.env[JOB_DIRS] = os.pathsep.join(p for p in (self.tmp, self.shm) if p)
        self.env[JOB_HOST] = socket.gethostname()

    def remove(self) -> None:
        for path in (self.tmp, self.shm):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


def rank_environment(env: dict[str, str]) -> None:
    """In the wrapper: give the rank the user's TMPDIR (its files are its own), not the job's."""
    user = env.pop(USER_TMPDIR, None)
    env.pop(JOB_DIRS, None)
    env.pop(JOB_HOST, None)
    if user is None:
        return
    if user:
        env["TMPDIR"] = user
    else:
        env.pop("TMPDIR", None)


def remove_job_dirs(env: Mapping[str, str]) -> list[str]:
    """After the launcher died: remove the per-job directories it named (only directories of ours, by name);
    returns those removed."""
    removed: list[str] = []
    if env.get(JOB_HOST) != socket.gethostname():
        return removed  # another machine's directories, or this one's seen from another node's namespace
    for path in env.get(JOB_DIRS, "").split(os.pathsep):
        if os.path.basename(path.rstrip("/")).startswith(JOB_PREFIX) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def unlink_reported(paths: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """In the launcher, once the job has ended: unlink the shared-memory files that this machine's wrappers
    reported and that are still there (a wrapper that mpiexec SIGKILLed could not sweep them itself); only
    MPI's and hpcring's names under the shared-memory directories."""
    roots = tuple(os.path.realpath(r) + "/" for r in _shm_roots(env))
    removed = []
    for path in sorted(set(paths)):
        real = os.path.realpath(path)
        if real.startswith(roots) and _transient(real) and os.path.isfile(real):
            with contextlib.suppress(OSError):
                os.unlink(real)
                removed.append(real)
    return removed


def _shm_roots(env: Mapping[str, str]) -> tuple[str, ...]:
    extra = env.get("HPCRING_SHM_DIR", "")
    return (*SHM_ROOTS, extra) if extra else SHM_ROOTS


def mapped_files(pid: int, roots: Iterable[str]) -> set[str]:
    """Files under `roots` that process `pid` maps (deleted ones left out: already gone)."""
    prefixes = tuple(r.rstrip("/").encode() + b"/" for r in roots)
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return set()
    out = set()
    for prefix in prefixes:  # a byte search first: most samples find nothing, and the kernel's text is long
        start = data.find(b" " + prefix)
        while start >= 0:
            end = data.find(b"\n", start)
            path = data[start + 1 : end if end >= 0 else len(data)].decode(errors="replace")
            if not path.endswith(" (deleted)") and _transient(path):
                out.add(path)
            start = data.find(b" " + prefix, start + 1)
    return out


def _transient(path: str) -> bool:
    return os.path.basename(path).startswith(TRANSIENT) or f"/{JOB_PREFIX}" in path


def descendants(pid: int) -> list[int]:
    """All descendants of `pid` (by /proc's children lists)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


class ShmTracker:
    """In a wrapper: which shared-memory files its rank maps, and their removal once nobody of the node's
    job maps them any more."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.roots = _shm_roots(env)
        self.seen: set[str] = set()
        self.next_at = 0.0
        self.interval = SAMPLE_FIRST_S

    def sample(self, pid: int, now: float, force: bool = False) -> set[str]:
        """Note what `pid` (and its own children) map; returns the files not seen before. Unless forced
        (before the wrapper ends the rank), 1 s after the last look at first, then ever less often, up to
        8 s: MPI sets up its shared memory at initialisation, and a rank that dies later without its
        wrapper's last look leaves its node's segments to the siblings' wrappers, which look again when
        they end their own ranks."""
        if not force and now < self.next_at:
            return set()
        self.next_at = now + self.interval
        self.interval = min(2 * self.interval, SAMPLE_MOST_S)
        found: set[str] = set()
        for p in (pid, *descendants(pid)):
            found |= mapped_files(p, self.roots)
        new = found - self.seen
        self.seen |= new
        return new

    def sweep(self, node_root: int | None) -> list[str]:
        """Unlink the files seen that still exist and that no process under `node_root` (the MPI daemon that
        started this node's ranks) maps, waiting up to SIBLING_WAIT_S for ranks that are ending. Returns the
        paths removed."""
        left = {p for p in self.seen if os.path.exists(p)}
        deadline = time.monotonic() + SIBLING_WAIT_S
        removed: list[str] = []
        while left:
            others = [p for p in descendants(node_root) if p != os.getpid()] if node_root else []
            busy = set().union(*(mapped_files(p, self.roots) for p in others)) if others else set()
            for path in sorted(left - busy):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed.append(path)
            left &= busy
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return removed
