"""`hpcring run`'s supervisor: starts mpiexec, talks to every rank's wrapper, prints output, ends the job.

One thread, one selector: the control socket accepts the wrappers, their frames carry output and exit reports,
and a periodic tick watches mpiexec and the deadlines. The first rank that fails decides the exit code; every
other rank is then told to stop (SIGTERM, then SIGKILL after the wrapper's grace), and mpiexec is killed if it
lingers, so the whole job ends within ~10 s of a failure. In an elastic world a rank's error before its first
commit lets the others run on a few seconds first, so the driver can see whether they all fail alike.
Heartbeats flow both ways on every connection; a node silent for the silence timeout (`liveness`) is named
and counts as failed, so a partitioned or frozen node ends the job in bounded time instead of hanging it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from hpcring.contracts.elastic import RESET_EXIT_CODE
from hpcring.contracts.rank_env import RANK_VARIABLES, rank_environment
from hpcring.contracts.wallclock import REQUEUE_EXIT_CODE, STOPPED_EXIT_CODE, WARNINGS, checkpoint_dir
from hpcring.errors import LaunchError
from hpcring.launch import cleanup, control, liveness, protocol
from hpcring.launch.command import LaunchSpec, build
from hpcring.launch.flavour import MpiInstall
from hpcring.launch.layout import emulated_nodes, node_of_hosts, places
from hpcring.launch.mpi_output import MpiOutput
from hpcring.launch.report import ErrorReport, RankFailure

_TICK_S = 0.2  # the loop's select timeout: deadlines are checked at least this often
_LATE_S = 0.5  # a loop iteration this much later than its timeout: the launcher itself was not running
ABORT_GRACE_S = 6.0  # after telling survivors to stop, before killing mpiexec's process group
# Elastic: after a rank fails by an error before committing, how long the others may go on to show whether
# they fail alike (a broken script) before they are ended (docs/guide/elastic.md, which failures blacklist a
# host).
VERDICT_HOLD_S = 5.0
SIGNAL_GRACE_S = 2.0  # the same when a signal ends the job: its sender (a batch system) waits only seconds
KILL_GRACE_S = 2.0  # mpiexec's group: SIGTERM, then SIGKILL after this (it may wait on unreachable nodes)
_FORWARD_SKIP_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDRA_", "MPIR_", "MPI_LOCAL", "SLURM_", "LSB_")
_FORWARD_SKIP = frozenset(
    {"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "TERM", "DISPLAY", "SSH_CONNECTION", protocol.TOKEN_VARIABLE}
)


def describe_end(code: int | None, sig: int | None) -> str:
    """How a rank ended, in the words the launcher prints: 'exited with code 3' / 'was killed by ...'."""
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by signal {sig} ({name})"
    return f"exited with code {code}"


def _clip(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def exit_status(code: int | None, sig: int | None) -> int:
    """Shell convention: a signal becomes 128 + its number."""
    return 128 + sig if sig is not None else int(code or 0)


def free_port() -> int:
    """A TCP port free on this machine now, for MASTER_PORT (torch's rendezvous on rank 0's host)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _term_with_parent() -> None:
    """In mpiexec before exec: SIGTERM if the launcher dies (even by SIGKILL), so mpiexec ends its ranks."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's variables that remote ranks get when theirs lack them (MPI internals excluded)."""
    return {
        k: v
        for k, v in env.items()
        if k not in _FORWARD_SKIP and not k.startswith(_FORWARD_SKIP_PREFIXES) and k not in RANK_VARIABLES
    }


@dataclass
class Conn:
    """One wrapper's connection."""

    sock: socket.socket
    # A wrapper's frames are output chunks (64 KiB reads) and small reports.
    reader: protocol.FrameReader = field(default_factory=lambda: protocol.FrameReader(1 << 20))
    rank: int | None = None
    host: str = ""
    partial: dict[bytes, bytes] = field(default_factory=dict)
    exited: bool = False
    heard: float = field(default_factory=time.monotonic)  # when anything last arrived from the wrapper
    outbox: bytearray = field(default_factory=bytearray)  # control frames the socket has not taken yet
    ended: float | None = None  # when the wrapper reported its rank's exit (monotonic)


class Supervisor:
    """Runs one job; `run()` returns the launcher's exit code."""

    def __init__(
        self,
        install: MpiInstall,
        spec: LaunchSpec,
        *,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        env: Mapping[str, str] | None = None,
        elastic: bool = False,
        rank_env: Callable[[int], Mapping[str, str]] | None = None,
        hostname: Callable[[int], str] | None = None,
        on_tick: Callable[[Supervisor], None] | None = None,
    ) -> None:
        self.install = install
        self.elastic = elastic  # a rank exiting with RESET_EXIT_CODE asks for a relaunch, not a failure
        self.rank_env = rank_env  # extra variables per rank (the elastic driver's host assignment)
        # A rank's host name (HOROVOD_HOSTNAME): the elastic driver's assignment, else what its machine says.
        self.hostname = hostname
        self.on_tick = on_tick  # called from the loop (the elastic driver watches discovery from here)
        self.reset_rank: int | None = None
        self.output_files: dict[tuple[int, str], BinaryIO] = {}
        self.spec = spec
        self.out = stdout or sys.stdout.buffer
        self.err = stderr or sys.stderr.buffer
        self.base_env = dict(os.environ if env is None else env)
        self.token = secrets.token_hex(16)
        self.gate = control.Gate(self.token, self._note)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}  # by rank, once known
        self.failure: tuple[int, str, int] | None = None  # (rank, how, exit status) of the first failure
        self.failures: list[RankFailure] = []  # every rank that failed on its own, in order
        # (rank, what) of each rank that exited 0 while others still ran (`_left_early`)
        self.left: list[tuple[int, str]] = []
        self.hold_until: float | None = None  # elastic: others run on until then (VERDICT_HOLD_S)
        self.interrupted: int | None = None
        self.warned: int | None = None  # the wall-clock warning passed on to the ranks (SIGUSR1/SIGUSR2)
        self.requeue_status: int | None = None  # REQUEUE/STOPPED_EXIT_CODE: the ranks checkpointed and left
        self.started = False
        self.released_at: float | None = None  # when every rank had checked in and was sent its environment
        self.abort_at: float | None = None
        self.mpiexec: subprocess.Popen[bytes] | None = None
        self.master_port = free_port()
        self.silence_s = liveness.silence_timeout(spec.settings, self.base_env)  # 0: never
        self.beat_at = 0.0
        self.lost: dict[str, list[int]] = {}  # host -> ranks of the nodes not heard from
        self.shm_paths: set[str] = set()  # shared memory this machine's ranks mapped (cleanup.py)
        self.ran_at = time.monotonic()  # when the loop was last seen running (`_still_running`)

    # ---- output -------------------------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        self.err.write(f"hpcring run: {text}\n".encode())
        self.err.flush()

    def _emit(self, conn: Conn, kind: bytes, data: bytes, final: bool = False) -> None:
        """Write whole lines only, each prefixed with `[rank]<stream>:`; a last partial line at the end."""
        buf = conn.partial.get(kind, b"") + data
        lines = buf.split(b"\n")
        rest = lines.pop()
        # At the end, or for a runaway line without newline: pass it on rather than hoard it.
        if (final and rest) or len(rest) > 1 << 20:
            lines.append(rest)
            rest = b""
        conn.partial[kind] = rest
        if not lines:
            return
        stream = self.out if kind == protocol.STDOUT else self.err
        name = "stdout" if kind == protocol.STDOUT else "stderr"
        if self.spec.output_dir is not None:
            self._save_output(conn, name, lines)
        stamp = time.strftime("%a %b %d %H:%M:%S %Y").encode() if self.spec.timestamp else b""
        tag = stamp + (f"[{conn.rank}]<{name}>:".encode() if self.spec.prefix else b"")
        stream.write(b"".join(tag + line + b"\n" for line in lines))
        stream.flush()

    def _save_output(self, conn: Conn, name: str, lines: list[bytes]) -> None:
        """horovodrun's --output-filename: every rank's lines also go to DIR/rank.N/stdout|stderr."""
        assert self.spec.output_dir is not None
        key = (conn.rank or 0, name)
        f = self.output_files.get(key)
        if f is None:
            path = os.path.join(self.spec.output_dir, f"rank.{key[0]}")
            os.makedirs(path, exist_ok=True)
            f = self.output_files[key] = open(os.path.join(path, name), "ab")  # noqa: SIM115 (closed in run)
        f.write(b"".join(line + b"\n" for line in lines))
        f.flush()

    # ---- job control --------------------------------------------------------------------------------------
    def _fail(self, rank: int, how: str, status: int, error: ErrorReport | None = None) -> None:
        """A rank failed on its own. The first failure ends the job, except in an elastic world where a
        rank's error before its first commit lets the others run on briefly: if they fail alike, the
        script is broken and no host is to blame (hpcring.launch.elastic.verdict)."""
        if self.interrupted is not None or self.abort_at is not None:
            return
        if self.failure is not None and error is None:
            # Holding: a rank killed by a signal or lost now is most likely mpiexec ending the job because
            # the first rank left MPI without finalising; it tells nothing about the script or its host.
            return
        self.failures.append(RankFailure(rank, how, status, error))
        what = f" ({_clip(error.summary)})" if error is not None and error.kind == "exception" else ""
        if self.failure is not None:  # holding: another rank failed by an error while we watch
            self._note(f"rank {rank} {how}{what}")
            return
        self.failure = (rank, how, status)
        if self.left and (error is None or error.kind != "exception"):  # not its own error: the leaver's
            self._note(self.left[0][1])
            what = f"{what}, after rank {self.left[0][0]} left"
        if self.elastic and error is not None and error.committed is not True:
            self.hold_until = time.monotonic() + VERDICT_HOLD_S
            self._note(f"rank {rank} {how}{what}")
            return
        self._note(f"rank {rank} {how}{what}; ending the other ranks")
        self._abort()

    def _end_hold(self, now: float) -> None:
        """End the verdict hold once every rank has ended, or when it expires (ending the others)."""
        if self.hold_until is None or self.abort_at is not None:
            return
        live = sorted(r for r, c in self.conns.items() if not c.exited)
        if live and now < self.hold_until:
            return
        self.hold_until = None
        if live:
            self._note(f"ending the other ranks ({', '.join(map(str, live))})")
        self._abort()

    def _abort(self, grace: float = ABORT_GRACE_S) -> None:
        """Tell every running wrapper to end its command; mpiexec is killed if it lingers past the grace."""
        if self.abort_at is not None:
            return
        self.abort_at = time.monotonic() + grace
        for conn in self.conns.values():
            if not conn.exited:
                self._send(conn, protocol.json_frame(protocol.TERMINATE, {"reason": "job aborted"}))

    def notify(self, message: Mapping[str, object]) -> None:
        """Send every running wrapper an elastic host-update notice (it writes it to its node's file)."""
        for conn in self.conns.values():
            if not conn.exited:
                self._send(conn, protocol.json_frame(protocol.NOTIFY, dict(message)))

    def _send(self, conn: Conn, data: bytes) -> None:
        """Queue a frame and send what the socket takes now: never blocks (a wrapper on an unreachable node
        stops taking bytes, and the loop must go on), never sends half a frame and then another."""
        conn.outbox += data
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            conn.outbox.clear()
            return
        del conn.outbox[:sent]

    def _liveness(self, now: float) -> None:
        """Heartbeat every wrapper (and flush what they have not taken); name nodes silent for too long."""
        for conn in self.conns.values():
            if conn.outbox and not conn.exited:
                self._send(conn, b"")
        if now < self.beat_at:
            return
        self.beat_at = now + liveness.heartbeat_interval(self.silence_s)
        live = [c for c in self.conns.values() if not c.exited]
        for conn in live:
            self._send(conn, protocol.frame(protocol.HEARTBEAT, b""))
        silent = [c for c in live if self.silence_s and now - c.heard > self.silence_s]
        if silent:
            self._lose(silent)

    def _lose(self, silent: list[Conn], for_s: float | None = None) -> None:
        """Nodes not heard from: their ranks count as failed (elastic: their hosts are blacklisted)."""
        lost: dict[str, list[int]] = {}
        for conn in silent:
            assert conn.rank is not None
            conn.exited = True  # nothing more will come; do not wait for it
            lost.setdefault(conn.host, []).append(conn.rank)
            self.lost.setdefault(conn.host, []).append(conn.rank)
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn.sock)
            conn.sock.close()
        text = liveness.lost_nodes_text(lost, self.silence_s if for_s is None else round(for_s))
        if self.failure is None and self.interrupted is None and self.abort_at is None:
            first = min(r for ranks in lost.values() for r in ranks)
            self.failure = (first, f"is on {text}", 1)
            self._note(f"{text}; ending the other ranks")
            self._abort()
        else:
            self._note(text)

    def _reset(self, rank: int) -> None:
        """A rank saved its state and left for an elastic relaunch: end the others (commits are safe)."""
        if self.reset_rank is None and self.failure is None and self.interrupted is None:
            self.reset_rank = rank
            self._abort()

    def _aborting(self) -> bool:
        return self.abort_at is not None

    def _kill_mpiexec(self, sig: signal.Signals) -> None:
        if self.mpiexec is not None and self.mpiexec.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.mpiexec.pid, sig)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.interrupted is None:
            self.interrupted = signum
            self._note(f"received {signal.Signals(signum).name}; ending all ranks")
            self._abort(SIGNAL_GRACE_S)

    def _on_warning(self, signum: int, _frame: object) -> None:
        """A wall-clock warning (the batch script forwards the scheduler's): every rank gets it, and
        checkpoints at its next commit (hpcring.torch.wallclock)."""
        if self.warned is None:
            self._note(f"received {signal.Signals(signum).name}; passing it to every rank")
        self.warned = signum
        for conn in self.conns.values():
            if not conn.exited:
                self._send(conn, protocol.json_frame(protocol.SIGNAL, {"signal": int(signum)}))

    def _requeue_exit(self, code: int | None, sig: int | None) -> bool:
        """A rank left with 85/86 after a warning: one this launcher passed on, or one a batch script's trap
        wrote into the job's checkpoint directory (then only the job's naming one tells it apart from a
        script's own exit code)."""
        if sig is not None or code not in (REQUEUE_EXIT_CODE, STOPPED_EXIT_CODE):
            return False
        named = {**self.base_env, **self.spec.settings}  # the variable, or `hpcring run --checkpoint-dir`
        return self.warned is not None or bool(checkpoint_dir(named))

    # ---- control socket -----------------------------------------------------------------------------------
    def _accept(self, server: socket.socket) -> None:
        conn, dropped = self.gate.accept(server)
        for gone in dropped:
            self._close_pending(gone)
        if conn is not None:
            self.sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _close_pending(self, conn: control.Pending) -> None:
        self.gate.forget(conn)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def _authenticate(self, pending: control.Pending) -> None:
        """Bytes from a connection that has not proved the token yet: once it has, it is a wrapper's."""
        try:
            if self.gate.receive(pending) is None:
                return
        except protocol.ProtocolError as exc:
            self.gate.refuse(pending.peer, str(exc))
            self._close_pending(pending)
            return
        self.sel.modify(pending.sock, selectors.EVENT_READ, Conn(pending.sock))

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._closed(conn)
            return
        # A stop before these bytes arrived is judged before they are acted on: the wrappers' reports that
        # they gave the launcher up must not be taken for their ranks' own failures.
        conn.heard = self._still_running()
        try:
            for kind, payload in conn.reader.feed(data):
                self._frame(conn, kind, payload)
        except protocol.ProtocolError as exc:
            self._note(f"dropping {self._whose(conn)} control connection: {exc}")
            self._closed(conn)
        except Exception as exc:  # no input may end the launcher; this one is a bug, and says so
            self._note(f"dropping {self._whose(conn)} control connection: {type(exc).__name__}: {exc}")
            self._closed(conn)

    @staticmethod
    def _whose(conn: Conn) -> str:
        return "an unnamed" if conn.rank is None else f"rank {conn.rank}'s"

    def _frame(self, conn: Conn, kind: bytes, payload: bytes) -> None:
        if kind == protocol.HEARTBEAT:
            return
        if kind == protocol.HELLO:
            self._hello(conn, protocol.hello(payload))
        elif conn.rank is None:
            raise protocol.ProtocolError(f"a {kind!r} frame before the wrapper's hello")
        elif kind in (protocol.STDOUT, protocol.STDERR):
            self._emit(conn, kind, payload)
        elif kind == protocol.EXITED:
            self._exited(conn, protocol.exited(payload))
        elif kind == protocol.STARTED:
            protocol.started(payload)
        elif kind == protocol.SHM:
            paths = protocol.shm_paths(payload)
            if conn.host == socket.gethostname() and len(self.shm_paths) < 4096:
                self.shm_paths.update(paths)
        else:
            raise protocol.ProtocolError(f"unknown frame type {kind!r}")

    def _hello(self, conn: Conn, hello: dict[str, object]) -> None:
        rank, size = hello["rank"], hello["size"]
        assert isinstance(rank, int)
        if conn.rank is not None or rank in self.conns or not 0 <= rank < self.spec.np:
            raise protocol.ProtocolError(f"unexpected or duplicate rank {rank}")
        if size != self.spec.np:
            raise protocol.ProtocolError(f"rank {rank} reports world size {size}, expected {self.spec.np}")
        conn.rank, conn.host = rank, str(hello["host"])
        self.conns[rank] = conn
        if len(self.conns) == self.spec.np:
            self._go()

    def _go(self) -> None:
        """Every rank has checked in: send each its environment, computed from where the ranks really run."""
        hosts = [self.conns[r].host for r in range(self.spec.np)]
        if self.spec.emulate_nodes:
            nodes = emulated_nodes(self.spec.np, self.spec.emulate_nodes)
        else:
            nodes = node_of_hosts(hosts)
        defaults = forwarded_env(self.base_env)
        defaults.setdefault("PYTHONUNBUFFERED", "1")
        common = dict(self.spec.settings)
        if self.spec.emulate_nodes:
            common["HPCRING_EMULATE_NODES"] = str(self.spec.emulate_nodes)
        master = self.spec.master_addr()
        for place in places(nodes):
            override = {**common}
            override.update(
                rank_environment(
                    rank=place.rank,
                    size=self.spec.np,
                    local_rank=place.local_rank,
                    local_size=place.local_size,
                    cross_rank=place.cross_rank,
                    cross_size=place.cross_size,
                    hostname=self.hostname(place.rank) if self.hostname else hosts[place.rank],
                    master_addr=master,
                    master_port=self.master_port,
                )
            )
            if self.rank_env is not None:
                override.update(self.rank_env(place.rank))
            self._send(
                self.conns[place.rank],
                protocol.json_frame(protocol.GO, {"override": override, "defaults": defaults}),
            )
        self.started = True
        self.released_at = time.monotonic()

    def rank_times(self) -> dict[int, tuple[str, float]]:
        """rank -> (host, seconds from its release to its exit report), for the ranks that reported."""
        if self.released_at is None:
            return {}
        return {r: (c.host, c.ended - self.released_at) for r, c in self.conns.items() if c.ended is not None}

    def _stopped_first(self, conn: Conn, reason: object, status: int) -> bool:
        """A rank its wrapper ended for staying stopped is the cause even when its peer's report came first:
        the peer failed because the stopped rank's connections closed under it (its MPI aborts at once,
        while the stopped rank's wrapper still drains its pipes)."""
        if self.elastic or self.failure is None or not isinstance(reason, str):
            return False
        if not reason.startswith("was stopped") or conn.rank is None or conn.rank == self.failure[0]:
            return False
        how = f"on {conn.host} {_clip(reason)}"
        self._note(f"rank {conn.rank} {how}: the cause (rank {self.failure[0]} failed after it)")
        self.failure = (conn.rank, how, status)
        return True

    def _exited(self, conn: Conn, report: dict[str, object]) -> None:
        conn.exited = True
        conn.ended = time.monotonic()
        for kind in list(conn.partial):
            self._emit(conn, kind, b"", final=True)
        code = report.get("code")
        sig = report.get("signal")
        code_i = int(code) if isinstance(code, int) else None
        sig_i = int(sig) if isinstance(sig, int) else None
        if self._stopped_first(conn, report.get("reason"), exit_status(code_i, sig_i)):
            return
        if report.get("ended_by_launcher") or self.abort_at is not None:
            return  # one we (or a failing peer) ended: not the cause
        if self._requeue_exit(code_i, sig_i):
            self.requeue_status = code_i  # checkpointed on the warning: every rank leaves the same way
            return
        if self.elastic and code_i == RESET_EXIT_CODE and sig_i is None:
            assert conn.rank is not None
            self._reset(conn.rank)
            return
        if sig_i is None and code_i == 0:
            self._left_early(conn)
        if sig_i is not None or code_i != 0:
            assert conn.rank is not None
            error = None
            if sig_i is None:
                error = ErrorReport.from_json(report.get("error")) or ErrorReport.for_exit_code(
                    int(code_i or 0)
                )
            reason = report.get("reason")  # the wrapper ended it (a rank stopped for too long)
            how = describe_end(code_i, sig_i)
            if isinstance(reason, str):
                how = f"on {conn.host} {_clip(reason)}"
            self._fail(conn.rank, how, exit_status(code_i, sig_i), error if reason is None else None)

    def _left_early(self, conn: Conn) -> None:
        """A rank exited 0 while others still run. When one of them then fails without an error of its own
        (killed by mpiexec, lost, an exit status), the leaver is the cause and is named with that failure."""
        others = sorted(r for r, c in self.conns.items() if not c.exited)
        if others:
            word = "rank" if len(others) == 1 else "ranks"
            what = (
                f"rank {conn.rank} (host {conn.host}) left the job: it exited with code 0 while {word} "
                f"{', '.join(map(str, others))} still ran (os._exit, or a return before the others' last "
                "collective)"
            )
            self.left.append((conn.rank or 0, what))

    def _relay(self, key: selectors.SelectorKey) -> None:
        out: MpiOutput = key.data
        try:
            data = os.read(key.fd, 65536)
        except OSError:
            data = b""
        if data:
            out.feed(data)
        else:
            self.sel.unregister(key.fileobj)
            out.feed(b"", final=True)

    def _closed(self, conn: Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.rank is None:
            return
        for kind in list(conn.partial):
            self._emit(conn, kind, b"", final=True)
        if not conn.exited:
            conn.exited = True
            if self.abort_at is None:
                self._fail(conn.rank, "lost contact with the launcher (its wrapper died)", 1)

    # ---- main loop ----------------------------------------------------------------------------------------
    def wrapper_argv(self, addresses: list[str]) -> list[str]:
        """How mpiexec starts the per-rank wrapper (same python as the launcher: the venv with the MPI)."""
        return [
            sys.executable,
            "-m",
            "hpcring.launch.rankwrap",
            "--control",
            ",".join(addresses),
            *(["--silence-timeout", f"{self.silence_s:g}"] if self.silence_s else []),
            *(["--fail-fast"] if self.spec.fail_fast else []),
            "--",
            *self.spec.command,
        ]

    def run(self, on_start: Callable[[list[str]], None] | None = None) -> int:
        servers, addresses = control.listen([h.name for h in self.spec.hosts], self.spec.remote)
        for server in servers:
            server.setblocking(False)
            self.sel.register(server, selectors.EVENT_READ, None)
        argv, env = build(self.install, self.spec, self.wrapper_argv(addresses), self.base_env)
        env[protocol.TOKEN_VARIABLE] = self.token  # never argv: see protocol.TOKEN_VARIABLE
        dirs = cleanup.JobDirs(
            self.base_env, openmpi=self.install.flavour == "openmpi", local=not self.spec.remote
        )
        env.update(dirs.env)
        if on_start:
            on_start(argv)
        previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        previous.update({signal.Signals(s): signal.signal(s, self._on_warning) for s in WARNINGS})
        try:
            try:
                self.mpiexec = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # we signal its group; a terminal's Ctrl-C reaches us, not it
                    preexec_fn=_term_with_parent,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
            aborting = self._aborting
            assert self.mpiexec.stdout is not None and self.mpiexec.stderr is not None
            self.sel.register(self.mpiexec.stdout, selectors.EVENT_READ, MpiOutput(self.out, aborting))
            self.sel.register(self.mpiexec.stderr, selectors.EVENT_READ, MpiOutput(self.err, aborting))
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._kill_mpiexec(signal.SIGKILL)
            if self.mpiexec is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.mpiexec.wait(
                        timeout=KILL_GRACE_S
                    )  # a live prterun could write its session dir again
            dirs.remove()
            cleanup.unlink_reported(self.shm_paths, self.base_env)
            for key in list(self.sel.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self.sel.close()
            for f in self.output_files.values():
                f.close()

    def _loop(self) -> int:
        assert self.mpiexec is not None
        start_deadline = time.monotonic() + self.spec.start_timeout_s
        mpiexec_done_at: float | None = None
        killed = False
        self.ran_at = time.monotonic()
        while True:
            events = self.sel.select(timeout=_TICK_S)
            self._still_running(_TICK_S)  # before reading: judge what arrived knowing it
            for key, _ in events:
                if key.data is None:
                    self._accept(key.fileobj)  # type: ignore[arg-type]
                elif isinstance(key.data, MpiOutput):
                    self._relay(key)
                elif isinstance(key.data, control.Pending):
                    self._authenticate(key.data)
                else:
                    self._read(key.data)
            if self.on_tick is not None:
                self.on_tick(self)
            now = self._still_running()  # stopped while handling events: judged before liveness
            for stale in self.gate.expired(now):
                self._close_pending(stale)
            self._end_hold(now)
            self._liveness(now)
            if not self.started and now > start_deadline and self.abort_at is None:
                self._note(
                    f"only {len(self.conns)} of {self.spec.np} ranks started within "
                    f"{self.spec.start_timeout_s:g} s; ending the job"
                )
                self.failure = (-1, "did not start", 1)
                self._abort()
            if self.abort_at is not None and now > self.abort_at and not killed:
                self._kill_mpiexec(signal.SIGTERM)
                killed = True
                self.abort_at = now + KILL_GRACE_S
            elif killed and self.abort_at is not None and now > self.abort_at:
                self._kill_mpiexec(signal.SIGKILL)
            if mpiexec_done_at is None and self.mpiexec.poll() is not None:
                mpiexec_done_at = now
            live = any(not c.exited for c in self.conns.values())
            live |= any(isinstance(k.data, MpiOutput) for k in self.sel.get_map().values())
            for key in list(self.sel.get_map().values()):
                if isinstance(key.data, MpiOutput):
                    key.data.tick()
            # Done when mpiexec has exited, every wrapper has reported, its output is drained (or 3 s later;
            # 1 s when a signal ends the job, whose sender waits only seconds before its SIGKILL).
            drain = 1.0 if self.interrupted is not None else 3.0
            if mpiexec_done_at is not None and (not live or now - mpiexec_done_at > drain):
                break
            self._still_running()
        for key in list(self.sel.get_map().values()):
            if isinstance(key.data, MpiOutput):  # a daemon still holds the pipe: flush what we have
                key.data.feed(b"", final=True)
        self._silent_at_the_end(time.monotonic())
        return self._result()

    def _still_running(self, expected: float = 0.0) -> float:
        """Now, after judging the stretch since `ran_at` (a select of `expected` s, or plain work): one much
        longer means the launcher was stopped in it. Every stretch of the loop is judged, and every read
        before its bytes are handled, so a SIGSTOP that lands anywhere is never taken for the nodes' silence
        nor their reports for failures of their own."""
        now = time.monotonic()
        late = now - self.ran_at - expected
        self.ran_at = now
        if late > _LATE_S:
            self._after_a_stop(late)
        return now

    def _after_a_stop(self, late: float) -> None:
        """The loop did not run for `late` s (the launcher was stopped by SIGSTOP, or blocked, or its machine
        froze): that silence is ours, not the nodes', so it is not counted against them. Past the silence
        timeout the wrappers have given up on us (their dead-man switch ended the ranks): the job ends
        naming the launcher, and what the ranks sent before is still read and printed."""
        now = time.monotonic()
        for conn in self.conns.values():
            conn.heard = min(conn.heard + late, now)  # heard after the resume: not pushed into the future
        if not self.silence_s or late <= self.silence_s or self.abort_at is not None:
            return
        what = (
            f"this launcher was not running for {late:.0f} s (stopped, or its machine froze), longer than "
            f"the silence timeout ({self.silence_s:g} s): the rank wrappers gave it up and ended their ranks"
        )
        if self.failure is None and self.interrupted is None:
            self.failure = (-1, f"was ended because {what}", 1)
        self._note(f"{what}; ending the job")
        self._abort()

    def _silent_at_the_end(self, now: float) -> None:
        """Wrappers that never reported and sent nothing for two heartbeats are on lost nodes: name them
        even when the job ended before the silence timeout (a rank that noticed the lost peer failed first),
        so the error, and the host an elastic job drops, is the node rather than its victims."""
        if not self.silence_s:
            return
        quiet = 2 * liveness.heartbeat_interval(self.silence_s) + 1.0
        silent = [c for c in self.conns.values() if not c.exited and now - c.heard > quiet]
        if silent:
            self._lose(silent, now - min(c.heard for c in silent))

    def _result(self) -> int:
        assert self.mpiexec is not None
        rc = self.mpiexec.returncode
        if self.interrupted is not None:
            return 128 + self.interrupted
        if self.failure is not None:
            return self.failure[2]
        if self.requeue_status is not None:
            what = "requeue the job" if self.requeue_status == REQUEUE_EXIT_CODE else "requeue bound reached"
            self._note(f"the ranks checkpointed on the warning; exiting with {self.requeue_status} ({what})")
            return self.requeue_status
        if self.reset_rank is not None:
            return RESET_EXIT_CODE
        if len(self.conns) < self.spec.np:
            self._note(f"mpiexec exited with code {rc} before all {self.spec.np} ranks started")
            return rc if rc else 1
        if rc != 0:
            self._note(f"mpiexec exited with code {rc} although every rank succeeded")
            return rc if rc > 0 else 128 - rc
        return 0
