"""The Ray actor behind each worker: it holds the resources Ray placed, runs one MPI worker process and
relays the driver's calls to it (`hpcring.ray.worker`).

The worker is started as its own one-process MPICH job (`mpiexec -n 1`), the form a process needs to
connect to the others (`hpcring.launch.rendezvous`). It inherits the actor's environment, so the GPUs Ray
gave the actor (CUDA_VISIBLE_DEVICES) are the worker's. `HPCRING_RAY_MPIEXEC` names the MPICH `mpiexec` to
use (default: the one next to this Python, else PATH). Nothing here imports ray or MPI, so the class is
plain and `ray.remote` wraps it in the driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from hpcring.errors import ConfigError
from hpcring.ray import channel
from hpcring.ray._ray import ray_module
from hpcring.ray.worker import ACTOR_PID_VARIABLE, CHANNEL_VARIABLE

MPIEXEC_VARIABLE = "HPCRING_RAY_MPIEXEC"


def remote_class() -> Any:
    """`WorkerActor` as a Ray actor class. Threaded (max_concurrency): while `execute` waits for a worker
    stuck in a collective with a dead peer, `stop_worker` and `pid` must still run, or ending the world
    would wait behind the very call it ends."""
    return ray_module().remote(max_concurrency=4)(WorkerActor)


class WorkerFailed(RuntimeError):
    """The worker process failed to start or to form the world; the message carries its traceback."""


def _die_with_parent() -> None:
    """In mpiexec before exec: a signal when the actor dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        # SIGTERM, not SIGKILL: hydra then ends its process and removes its /tmp/hydra_hwloc_xmlfile_*.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def mpich_mpiexec(chosen: str | None = None) -> str:
    """The MPICH `mpiexec` the workers are started with (`chosen`, else HPCRING_RAY_MPIEXEC, else the one
    next to this Python or on PATH); ConfigError naming what was found otherwise."""
    from hpcring.launch import flavour

    install = flavour.detect_install(chosen or os.environ.get(MPIEXEC_VARIABLE) or None)
    if install.flavour != "mpich":
        raise ConfigError(
            f"hpcring.ray needs MPICH's mpiexec to start its workers, found {install.version} at "
            f"{install.mpiexec}: install 'hpcring[mpich]' in the Ray workers' environment or set "
            f"{MPIEXEC_VARIABLE} to MPICH's mpiexec (docs/guide/ray.md says why Open MPI cannot)"
        )
    return install.mpiexec


def _shm_segments(pid: int) -> list[str]:
    """MPICH's shared-memory files the worker has mapped (from /proc): removed after the worker is gone,
    since a worker that is killed (or leaves without MPI_Finalize) cannot remove them itself."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/dev/shm/mpich_shm_" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/dev/shm/"))


def _end_worker(proc: subprocess.Popen[bytes], pid: int | None) -> None:
    """Kill the worker process `pid` (if still running) and reap its `mpiexec -n 1`: mpiexec ends by itself
    once its process is gone (and removes its files); it is killed only if it does not within 3 s."""
    if pid is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=3)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _accept_worker(listener: socket.socket, token: str) -> socket.socket:
    """The first connection that presents `token`; others (a local stranger racing the worker) are dropped
    before anything of theirs is unpickled. The listener's timeout bounds each wait."""
    while True:
        sock, _ = listener.accept()
        sock.settimeout(None)
        if channel.admit(sock, token):
            return sock
        sock.close()


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


class WorkerActor:
    """One rank's resources and the process that runs its share of the training."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._info: dict[str, Any] = {}
        self._want_standby = False
        self._call_lock = threading.Lock()
        self._shm: list[str] = []
        self._standby: tuple[subprocess.Popen[bytes], socket.socket, int] | None = None
        self._standby_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what Horovod's workers answer
    def node_id(self) -> str:
        """Ray's id of the node this actor runs on."""
        ray = ray_module()

        return str(ray.get_runtime_context().get_node_id())

    def hostname(self) -> str:
        return socket.gethostname()

    def pid(self) -> int:
        """The actor's own process (tests kill it to simulate a lost worker)."""
        return os.getpid()

    def get_gpu_ids(self) -> list[int]:
        """CUDA devices Ray assigned to this actor."""
        ray = ray_module()

        return [int(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: dict[str, Any]) -> None:
        """Set variables in the actor, inherited by the worker started after."""
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> dict[str, str]:
        return dict(os.environ)

    def remove_files(self, paths: list[str]) -> None:
        """Remove files on this node: a dead actor's worker's shared-memory segments (after a moment, as
        that worker notices its actor is gone within half a second)."""
        time.sleep(1.0)
        _remove(paths)

    def stop_standby(self) -> None:
        """Stop the standby worker, if any (the job is over), removing its shared-memory files."""
        standby = self._take_standby()
        if standby is None:
            return
        proc, sock, pid = standby
        shm = _shm_segments(pid)
        sock.close()
        _end_worker(proc, pid)
        _remove(shm)

    def remove_tree(self, path: str) -> None:
        """Remove a directory on this actor's node (the elastic commit store, once the run is over)."""
        shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ the worker process
    def start_worker(self, spec: dict[str, Any], connect_timeout: float) -> None:
        """Start the worker process and hand it `spec` (rank, size, store, executable); returns at once.
        `spec["env"]` (the executor's extra_env_vars) is set in the actor first, so the worker inherits it.
        A standby process started after the previous world formed (`spec["standby"]`) is used if alive."""
        self.stop_worker(0.0)
        self.update_env_vars(spec.get("env", {}))
        standby = self._take_standby()
        proc, sock, pid = standby if standby is not None else self._spawn(connect_timeout)
        self._proc, self._sock, self._info = proc, sock, {"pid": pid}
        self._want_standby = bool(spec.get("standby"))
        channel.send(sock, spec)

    def _spawn(self, connect_timeout: float) -> tuple[subprocess.Popen[bytes], socket.socket, int]:
        """A new worker process, connected and greeted: (mpiexec process, channel, worker pid)."""
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(connect_timeout)
        token = secrets.token_hex(16)  # in the environment, never argv: see channel.admit
        env = {
            **os.environ,
            CHANNEL_VARIABLE: f"127.0.0.1:{listener.getsockname()[1]}",
            ACTOR_PID_VARIABLE: str(os.getpid()),
            channel.TOKEN_VARIABLE: token,
        }
        cmd = [mpich_mpiexec(), "-n", "1", sys.executable, "-m", "hpcring.ray.worker"]
        proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)
        try:
            sock = _accept_worker(listener, token)
            hello = channel.recv(sock)
        except (TimeoutError, EOFError, OSError):
            proc.kill()
            proc.wait()
            raise WorkerFailed(f"the worker process did not connect within {connect_timeout:g} s") from None
        finally:
            listener.close()
        return proc, sock, int(hello[1])

    def _start_standby(self) -> None:
        """Start the next world's worker now (elastic runs), so its imports are done before it is needed."""

        def spawn() -> None:
            with contextlib.suppress(Exception):
                self._standby = self._spawn(60.0)

        self._standby_thread = threading.Thread(target=spawn, daemon=True)
        self._standby_thread.start()

    def _take_standby(self) -> tuple[subprocess.Popen[bytes], socket.socket, int] | None:
        if self._standby_thread is not None:
            self._standby_thread.join()
            self._standby_thread = None
        standby, self._standby = self._standby, None
        if standby is not None and standby[0].poll() is not None:
            standby[1].close()
            return None
        return standby

    def ready(self) -> dict[str, Any]:
        """Wait until the worker has joined the world: its pid and host, or WorkerFailed (its traceback)."""
        reply = self._recv()
        if reply[0] != "ready":
            raise WorkerFailed(f"worker failed to join the world:\n{reply[1]}")
        self._shm = _shm_segments(int(reply[1]["pid"]))
        self._info = {**reply[1], "host": socket.gethostname(), "shm": self._shm}
        if self._want_standby:
            self._start_standby()
        return self._info

    def execute(self, fn: Any) -> Any:
        """Run `fn(executable)` in the worker; its exception is raised here with the worker's traceback."""
        if self._sock is None:
            raise WorkerFailed("no worker is running on this actor: call start() first")
        with self._call_lock:  # calls from run_remote and run may overlap: one at a time on the channel
            channel.send(self._sock, ("call", fn))
            reply = self._recv()
        if reply[0] == "ok":
            return reply[1]
        exc = reply[2]
        if isinstance(exc, BaseException):
            exc.add_note(f"in the worker:\n{reply[1]}")
            raise exc
        raise WorkerFailed(f"the function failed in the worker:\n{reply[1]}")

    def _recv(self) -> Any:
        if self._sock is None:
            raise WorkerFailed("no worker is running on this actor")
        try:
            return channel.recv(self._sock)
        except (EOFError, OSError):
            if self._proc is None:
                raise WorkerFailed("the worker was stopped: its world was ended") from None
            code = None
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self._proc.wait(timeout=5)
            raise WorkerFailed(f"the worker process ended (exit code {code})") from None

    def stop_worker(self, grace: float) -> None:
        """Ask the worker to leave, then kill what is left after `grace` seconds; idempotent."""
        if self._sock is not None:
            sock, self._sock = self._sock, None
            with contextlib.suppress(OSError):
                sock.settimeout(1.0)
                channel.send(sock, ("stop",))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a call blocked on it in another thread
            sock.close()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        pid = self._info.get("pid")
        _end_worker(proc, pid if isinstance(pid, int) else None)
        _remove(self._shm)
        self._shm = []
