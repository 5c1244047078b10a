"""Per-rank wrapper that `hpcring run` starts under mpiexec: `python -m hpcring.launch.rankwrap ... -- cmd`.

It never initialises MPI (the user's program does, inheriting the MPI launcher's variables and, for hydra, its
PMI socket). It tells the launcher its MPI rank and host over the control socket, receives the rank
environment once every rank has checked in, runs the command in its own process group, streams its output
back, and reports how it ended. It ends the command when the launcher asks, when it is signalled, or when
the launcher disappears: closes the connection, or falls silent for the silence timeout (a heartbeat flows
both ways, `liveness`); then it also ends the MPI daemon that started it, so no rank, wrapper or daemon of
a partitioned node outlives the job.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from hpcring.contracts.wallclock import WARNINGS, kind_of
from hpcring.launch import cleanup, liveness, protocol, report
from hpcring.launch.detection import mpi_rank_size
from hpcring.launch.target import is_python, own_python, python_target

CONNECT_TIMEOUT_S = 60.0
TERM_GRACE_S = 3.0  # SIGTERM -> SIGKILL; the launcher's 10 s promise includes this
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the wrapper dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _connect(addresses: Sequence[str], token: str, deadline: float) -> socket.socket:
    """Connect to the first reachable launcher address and prove the job's token, retrying until the
    deadline (the launcher listens before mpiexec starts, so failures are unreachable addresses, or a flood
    of strangers that made the launcher drop this connection before it answered, not a race)."""
    last: Exception | None = None
    while True:
        for address in addresses:
            host, _, port = address.rpartition(":")
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
            except OSError as exc:
                last = exc
                continue
            try:
                _answer_challenge(sock, token)
            except (OSError, protocol.ProtocolError) as exc:
                sock.close()
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            return sock
        if time.monotonic() > deadline:
            raise ConnectionError(f"cannot reach the hpcring launcher at {','.join(addresses)}: {last}")
        time.sleep(0.5)


def _answer_challenge(sock: socket.socket, token: str) -> None:
    """Read the launcher's nonce (exactly one CHALLENGE frame) and send its MAC under the token."""
    data = b""
    want = protocol.HEADER_BYTES + protocol.NONCE_BYTES
    while len(data) < want:
        chunk = sock.recv(want - len(data))
        if not chunk:
            raise ConnectionError("the launcher closed the connection before its challenge")
        data += chunk
    if data[:1] != protocol.CHALLENGE or int.from_bytes(data[1:5], "big") != protocol.NONCE_BYTES:
        raise protocol.ProtocolError("the launcher's first frame is not a challenge")
    sock.sendall(protocol.frame(protocol.AUTH, protocol.mac(token, data[protocol.HEADER_BYTES :])))


def _await_go(sock: socket.socket, reader: protocol.FrameReader, silence_s: float) -> tuple[bytes, bytes]:
    """The launcher's first frame other than a heartbeat (GO, or TERMINATE), heartbeating while waiting;
    ConnectionError when it closes the connection or is silent for `silence_s` (0: no limit)."""
    interval = liveness.heartbeat_interval(silence_s)
    heard = time.monotonic()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    try:
        while True:
            sock.sendall(protocol.frame(protocol.HEARTBEAT, b""))
            if sel.select(timeout=interval):
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the hpcring launcher closed the control connection")
                heard = time.monotonic()
                for kind, payload in reader.feed(data):
                    if kind != protocol.HEARTBEAT:
                        return kind, payload
            elif silence_s and time.monotonic() - heard > silence_s:
                raise ConnectionError(f"the hpcring launcher was not heard from for {silence_s:g} s")
    finally:
        sel.close()


class Wrapper:
    """Runs one rank's command and relays it to the launcher."""

    def __init__(
        self, sock: socket.socket, reader: protocol.FrameReader, rank: int, silence_s: float = 0.0
    ) -> None:
        self.sock = sock
        self.reader = reader
        self.rank = rank
        self.silence_s = silence_s  # 0: never give up on a silent launcher or a stopped rank
        self.interval = liveness.heartbeat_interval(silence_s)
        self.child: subprocess.Popen[bytes] | None = None
        self.ended_by_launcher = False
        self.launcher_gone = False  # its connection closed or broke: nothing more can be sent
        self.launcher_silent = False  # not heard from for the silence timeout (maybe only stopped)
        self.kill_at: float | None = None
        self.report_pipe: int | None = None  # read end of the runner's failure-report pipe
        self.heard = self.beat_at = time.monotonic()
        self.stopped_since: float | None = None
        self.reason: str | None = None  # why the wrapper itself ended the rank (reported to the launcher)
        self.shm = cleanup.ShmTracker(os.environ)

    def send(self, data: bytes) -> None:
        if self.launcher_gone:
            return
        try:
            self.sock.sendall(data)
        except OSError:  # closed, or stuck for the silence timeout (the socket's timeout)
            self.launcher_gone = True
            self.end_child()

    def start(self, cmd: Sequence[str], env: dict[str, str], reports: bool = False) -> None:
        """Start the command; `reports`: it runs under hpcring's pyrun, which reports how it failed."""
        pass_fds = []
        pmi_fd = env.get("PMI_FD")
        if pmi_fd and pmi_fd.isdigit():
            pass_fds.append(int(pmi_fd))  # hydra's simple-PMI socket must reach the MPI process
        write_end = None
        if reports:
            self.report_pipe, write_end = os.pipe()
            os.set_blocking(self.report_pipe, False)
            env = {**env, report.REPORT_FD: str(write_end)}
            pass_fds.append(write_end)
        try:
            self.child = self._popen(cmd, env, pass_fds)
        finally:
            if write_end is not None:
                os.close(write_end)
        self.send(protocol.json_frame(protocol.STARTED, {"pid": self.child.pid}))

    def _popen(self, cmd: Sequence[str], env: dict[str, str], pass_fds: list[int]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(cmd),
            env=env,
            stdin=None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
            preexec_fn=_die_with_parent,
        )

    def _error_report(self) -> dict[str, Any] | None:
        """What the runner reported about its failure, if it did (read once the command has ended)."""
        if self.report_pipe is None:
            return None
        data = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(self.report_pipe, 65536):
                data += chunk
        os.close(self.report_pipe)
        self.report_pipe = None
        found = report.receive(data)
        return found.to_json() if found is not None else None

    def end_child(self) -> None:
        """SIGTERM the command's process group now, SIGKILL it after the grace period."""
        if self.child is None or self.kill_at is not None:
            return
        self._track_shm(time.monotonic(), force=True)
        self._signal_group(signal.SIGTERM)
        self._signal_group(signal.SIGCONT)  # a stopped rank would keep SIGTERM pending until SIGKILL
        self.kill_at = time.monotonic() + TERM_GRACE_S

    def _track_shm(self, now: float, force: bool = False) -> None:
        """Note the shared memory the rank maps, and tell the launcher (cleanup.py)."""
        if self.child is None:
            return
        new = self.shm.sample(self.child.pid, now, force)
        if new:
            paths = sorted(new)[: protocol.MAX_PATHS]
            self.send(protocol.json_frame(protocol.SHM, {"paths": paths}))

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)

    def warn(self, signum: int) -> None:
        """Pass a wall-clock warning (SIGUSR1/SIGUSR2) to the command itself, not its group: a DataLoader's
        workers share the group and would die of a signal they do not handle."""
        if self.child is not None and self.child.poll() is None and self.kill_at is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.child.pid, signum)

    def run(self) -> int:
        """Relay output and control until the command has ended; returns its wait status as an exit code."""
        assert self.child is not None and self.child.stdout is not None and self.child.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.child.stdout, selectors.EVENT_READ, protocol.STDOUT)
        sel.register(self.child.stderr, selectors.EVENT_READ, protocol.STDERR)
        sel.register(self.sock, selectors.EVENT_READ, None)
        open_pipes = 2
        exited_at: float | None = None
        while True:
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    self._control(sel)
                    continue
                data = os.read(key.fd, 65536)
                if data:
                    self.send(protocol.frame(key.data, data))
                else:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
            now = time.monotonic()
            self._track_shm(now)
            self._liveness(now)
            if self.kill_at is not None and now >= self.kill_at:
                self._signal_group(signal.SIGKILL)
                self.kill_at = now + 3600
            if exited_at is None and self.child.poll() is not None:
                exited_at = now
                # Stragglers the command left in its group would otherwise become orphans.
                self._signal_group(signal.SIGKILL)
            # Finish when the pipes are drained, or shortly after exit if a grandchild still holds them.
            if exited_at is not None and (open_pipes == 0 or now - exited_at > 2.0):
                break
        sel.close()
        status = self.child.returncode
        code, sig = (status, None) if status >= 0 else (None, -status)
        ending = {"code": code, "signal": sig, "ended_by_launcher": self.ended_by_launcher}
        error = self._error_report()
        if error is not None and code:
            ending["error"] = error
        if self.reason is not None:
            ending["reason"] = self.reason
        self.send(protocol.json_frame(protocol.EXITED, ending))
        return status if status >= 0 else 128 - status

    def _liveness(self, now: float) -> None:
        """Heartbeat to the launcher; end the rank if the launcher fell silent or the rank stays stopped."""
        if now < self.beat_at:
            return
        self.send(protocol.frame(protocol.HEARTBEAT, b""))
        self.beat_at = now + self.interval
        if not self.silence_s or self.child is None or self.kill_at is not None:
            return
        if not (self.launcher_gone or self.launcher_silent) and now - self.heard > self.silence_s:
            # Output and the exit report still go into the connection: a launcher that was only stopped
            # reads them when it resumes (the socket's timeout bounds each send meanwhile).
            self._say(f"the launcher was not heard from for {self.silence_s:g} s; ending the rank")
            self.launcher_silent = True
            self.reason = f"was ended by its wrapper: no word from the launcher for {self.silence_s:g} s"
            self.end_child()
            return
        stopped = liveness.is_stopped(self.child.pid)
        self.stopped_since = (self.stopped_since or now) if stopped else None
        if self.stopped_since is not None and now - self.stopped_since > self.silence_s:
            self.reason = f"was stopped (SIGSTOP) for {self.silence_s:g} s"
            self._say(f"the rank {self.reason}; ending it")
            self.end_child()

    def _say(self, text: str) -> None:
        """A line on the wrapper's own stderr (the MPI launcher relays it, or the node's log keeps it)."""
        with contextlib.suppress(OSError):
            sys.stderr.write(f"hpcring rankwrap: rank {self.rank} on {socket.gethostname()}: {text}\n")
            sys.stderr.flush()

    def _control(self, sel: selectors.BaseSelector) -> None:
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            # The launcher is gone (killed, or the job is being torn down): nobody may outlive it.
            self.launcher_gone = True
            sel.unregister(self.sock)
            self.end_child()
            return
        self.heard = time.monotonic()
        for kind, payload in self.reader.feed(data):
            if kind == protocol.TERMINATE:
                self.ended_by_launcher = True
                self.end_child()
            elif kind == protocol.NOTIFY:
                _write_notice(protocol.decode(payload))
            elif kind == protocol.SIGNAL:
                signum = protocol.decode(payload).get("signal")
                if isinstance(signum, int) and kind_of(signum) is not None:
                    self.warn(signum)


def _write_notice(message: dict[str, Any]) -> None:
    """The elastic driver announced a host change: put it where this node's ranks look for it."""
    from hpcring.contracts.elastic import write_notice

    with contextlib.suppress(OSError, KeyError, TypeError):
        write_notice(str(message["path"]), message["notice"])


def fail_fast_command(cmd: Sequence[str]) -> list[str]:
    """`python [opts] X ...` -> `python [opts] -m hpcring.launch.pyrun X ...` (see pyrun's docstring).

    Only for an interpreter of this very environment (same bin directory as ours, so it can import hpcring)
    running a script, `-m` or `-c`; anything else, including `python -m mpi4py` and stdin, is left alone.
    """
    exe = shutil.which(cmd[0]) if cmd else None
    if exe is None or not is_python(exe) or not own_python(exe):
        return list(cmd)
    target = python_target(cmd)
    if target is None or target.kind == "stdin" or (target.kind, target.value) == ("module", "mpi4py"):
        return list(cmd)
    i = target.index
    return [*cmd[:i], "-m", "hpcring.launch.pyrun", *cmd[i:]]


def _environment(go: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in go.get("defaults", {}).items():
        env.setdefault(key, value)
    env.update(go.get("override", {}))
    cleanup.rank_environment(env)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.launch.rankwrap", description=__doc__)
    parser.add_argument("--control", required=True, help="launcher address(es) HOST:PORT[,HOST:PORT]")
    parser.add_argument("--fail-fast", action="store_true", help="run Python commands under hpcring's pyrun")
    parser.add_argument(
        "--silence-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="end the rank when the launcher is silent, or the rank stopped, for S seconds (0: never)",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given after --")
    reports = False
    if args.fail_fast:
        given, cmd = cmd, fail_fast_command(cmd)
        reports = cmd != given
    # The job's secret: from the environment (never argv), and not passed on to the rank's command.
    token = os.environ.pop(protocol.TOKEN_VARIABLE, "")
    if not token:
        print(
            f"hpcring rankwrap: no job token in {protocol.TOKEN_VARIABLE}: the MPI launcher did not forward "
            "the launcher's environment to this host",
            file=sys.stderr,
        )
        return 1
    # The MPI launcher's own variables, not HPCRING_* (which a nested launch may have inherited).
    rank, size = mpi_rank_size(os.environ) or (0, 1)
    sock = _connect(args.control.split(","), token, time.monotonic() + CONNECT_TIMEOUT_S)
    sock.settimeout(args.silence_timeout or None)  # a send that cannot progress must not wedge the wrapper
    rank = rank or 0
    hello = {
        "rank": rank,
        "size": size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    protocol.send_json(sock, protocol.HELLO, hello)
    reader = protocol.FrameReader()
    wrapper = Wrapper(sock, reader, rank, args.silence_timeout)

    def on_signal(signum: int, _frame: object) -> None:
        # mpiexec (or a user) is ending the job: end the command gracefully, then report.
        wrapper.end_child()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    for warning in WARNINGS:  # an MPI launcher that forwards SIGUSR1/2 (Open MPI's does): pass it on
        signal.signal(warning, lambda signum, _frame: wrapper.warn(signum))
    try:
        kind, payload = _await_go(sock, reader, args.silence_timeout)
    except OSError as exc:  # ConnectionError included
        wrapper._say(f"{exc}; not starting the rank")
        return 1
    if kind != protocol.GO:
        return 1  # told to terminate before starting: nothing to run
    try:
        wrapper.start(cmd, _environment(protocol.decode(payload)), reports)
    except OSError as exc:
        msg = f"hpcring rankwrap: rank {rank}: cannot start {cmd[0]!r}: {exc.strerror or exc}\n"
        wrapper.send(protocol.frame(protocol.STDERR, msg.encode()))
        wrapper.send(protocol.json_frame(protocol.EXITED, {"code": 127, "signal": None}))
        return 127
    status = wrapper.run()
    wrapper.shm.sweep(liveness.mpi_parent())
    if wrapper.launcher_gone or wrapper.launcher_silent:
        # Dead-man switch: the launcher cannot end this node's MPI daemon any more; nobody else will.
        daemon = liveness.end_mpi_parent()
        if daemon:
            wrapper._say(f"ended its MPI daemon ({daemon}), which had lost the launcher too")
            wrapper.shm.sweep(None)  # the node's other ranks went with it
            cleanup.remove_job_dirs(os.environ)
        return status
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        # Wait for the launcher to close: it has then read every byte we sent.
        sock.settimeout(10)
        while sock.recv(65536):
            pass
    # The launcher owns the job's exit status and the abort of the other ranks; exiting 0 once it has our
    # report keeps mpiexec from racing it with its own kill (which can SIGKILL wrappers mid clean-up).
    return status if wrapper.launcher_gone else 0


if __name__ == "__main__":
    sys.exit(main())
