"""The control port under attack while a real job trains (issue 35, item 1).

A 2-rank training job (train_until.py: DistributedOptimizer steps until told to stop) runs under the real
launcher, started with `ulimit -n 256`. Meanwhile this test, as a neighbour who read the port from `ps`:
sends the issue's 7-byte frame, a 200,000-deep JSON, huge lengths, truncated frames and a few hundred random
frames (hypothesis) unauthenticated; opens 1,100 idle connections from a child process; holds one idle
connection to see it timed out; and, knowing the token (as the job's own user could), sends random and
hostile frames after a correct authentication. The launcher must stay up with its descriptors and memory
bounded, log refusals rate-limited and without a traceback, and the job must finish with exit 0 and each
rank's expected last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from job_processes import children, cmdlines, environ
from support import ROOT
from test_secrets import wait_ready

from hpcring.launch import control, protocol

PROGRAM = str(Path(__file__).with_name("train_until.py"))
NP = 2
LAUNCHER_NOFILE = 256
FLOOD = 1100
KINDS = [
    protocol.AUTH,
    protocol.HELLO,
    protocol.EXITED,
    protocol.STDOUT,
    protocol.STARTED,
    protocol.HEARTBEAT,
]

FLOOD_CHILD = """
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = []
for _ in range(int(sys.argv[2])):
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5))
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()
"""


def header(kind: bytes, length: int) -> bytes:
    return struct.pack(">cI", kind, length)


def poke(port: int, data: bytes) -> None:
    """Connect, send `data` (the launcher may drop us midway), close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, contextlib.suppress(OSError):
        s.sendall(data)


def authenticated(port: int, token: str) -> socket.socket:
    """A connection that proved the token, as a wrapper's does."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    challenge = b""
    while len(challenge) < protocol.HEADER_BYTES + protocol.NONCE_BYTES:
        challenge += s.recv(64)
    s.sendall(protocol.frame(protocol.AUTH, protocol.mac(token, challenge[protocol.HEADER_BYTES :])))
    return s


def after_auth(port: int, token: str, data: bytes) -> None:
    with authenticated(port, token) as s, contextlib.suppress(OSError):
        s.sendall(data)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fixed_corpus(port: int, token: str) -> None:
    """The issue's reproducers and the protocol's edges, before and after authentication."""
    deep = b"[" * 200_000
    for data in (
        b"H\0\0\0\x02[]",  # the 7 bytes
        protocol.frame(protocol.HELLO, deep),
        header(protocol.HELLO, 0xFFFFFFFF),
        header(protocol.AUTH, 63 << 20) + b"x" * (1 << 20),  # claims 63 MiB
        b"A\0\0",  # truncated
        protocol.frame(protocol.AUTH, os.urandom(protocol.MAC_BYTES)),  # a wrong MAC
        protocol.frame(protocol.AUTH, protocol.mac(token[::-1], os.urandom(32))),
    ):
        poke(port, data)
    for data in (
        b"H\0\0\0\x02[]",
        protocol.frame(protocol.HELLO, deep),
        protocol.frame(protocol.HELLO, b'{"rank": "0", "size": 2, "host": "x"}'),
        protocol.json_frame(protocol.HELLO, {"rank": 0, "size": NP, "host": "x"}),  # a duplicate rank
        protocol.json_frame(protocol.HELLO, {"rank": True, "size": NP, "host": "x"}),
        protocol.json_frame(protocol.EXITED, {"code": 0, "signal": None}),  # before any hello
        header(protocol.STDOUT, 0x7FFFFFFF),
        protocol.frame(b"Z", b""),
    ):
        after_auth(port, token, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
payloads = st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode())
frames = st.builds(
    lambda kind, body: protocol.frame(kind, body),
    st.sampled_from(KINDS) | st.binary(min_size=1, max_size=1),
    payloads,
)
raw = st.binary(max_size=600) | st.builds(
    lambda kind, length, body: header(kind, length) + body,
    st.sampled_from(KINDS),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=64),
)
quick = settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def random_frames(port: int, token: str) -> None:
    @quick
    @given(raw)
    def unauthenticated(data: bytes) -> None:
        poke(port, data)

    @quick
    @given(st.lists(frames, min_size=1, max_size=4))
    def authenticated_frames(sequence: list[bytes]) -> None:
        after_auth(port, token, b"".join(sequence))

    unauthenticated()
    authenticated_frames()


def flood(port: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", FLOOD_CHILD, str(port), str(FLOOD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    opened = int(child.stdout.readline())
    assert opened > LAUNCHER_NOFILE, f"the flood opened only {opened} connections"
    return child


def test_hostile_control_traffic_does_not_end_a_training_job(tmp_path: Path) -> None:
    py = sys.executable
    argv = [py, "-m", "hpcring", "run", "-np", str(NP), "--", py, PROGRAM, str(tmp_path)]

    def low_nofile() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (LAUNCHER_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    proc = subprocess.Popen(
        ["timeout", "-k", "5", "240", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=low_nofile,
    )
    try:
        wait_ready(proc, NP)
        (launcher,) = children(proc.pid)
        (mpiexec,) = children(launcher)
        words = cmdlines()[mpiexec].split(b"\0")
        port = int(words[words.index(b"--control") + 1].decode().rpartition(":")[2])  # as `ps` shows it
        token = environ(mpiexec)[protocol.TOKEN_VARIABLE]
        rss_before = rss_kib(launcher)
        idle = socket.create_connection(("127.0.0.1", port), timeout=control.AUTH_TIMEOUT_S + 20)
        fixed_corpus(port, token)
        random_frames(port, token)
        child = flood(port)
        fds = len(os.listdir(f"/proc/{launcher}/fd"))
        child.communicate("", timeout=30)
        rss_after = rss_kib(launcher)
        idle_bytes = b""
        while chunk := idle.recv(4096):  # the challenge, then the launcher's close (a timeout raises)
            idle_bytes += chunk
        idle.close()
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    for rank in range(NP):
        lines = [
            line for line in out.splitlines() if line.startswith(f"[{rank}]<stdout>:rank {rank} of {NP}:")
        ]
        assert len(lines) == 1 and lines[0].endswith(f"replicas agree, sum {NP * (NP + 1) // 2}"), out
    assert "Traceback" not in err, err[-3000:]
    assert "dropped a control connection from 127.0.0.1" in err, err[-3000:]
    assert "dropping an unnamed control connection: " in err, err[-3000:]
    assert f"no authentication within {control.AUTH_TIMEOUT_S:g} s" in err or "more refused since" in err
    assert len(idle_bytes) == protocol.HEADER_BYTES + protocol.NONCE_BYTES  # challenged, then dropped
    assert fds < control.PENDING_LIMIT + 64, f"{fds} descriptors held during a flood of {FLOOD}"
    assert rss_after - rss_before < 64 << 10, f"launcher RSS grew {rss_before} -> {rss_after} KiB"
