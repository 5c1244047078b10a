#!/usr/bin/env python3
"""ssh stand-in INSIDE a container: `podman_rsh.py [ssh-options] HOST COMMAND...` asks the test's relay on the
host (a unix socket bind-mounted at $HPCRING_RSH_SOCKET, default /run/hpcring-rsh/sock) to run COMMAND with
`sh -c` in the container that plays HOST, streams its output back and exits with its status, as ssh would.

Given to `hpcring run --rsh-agent`, it lets Open MPI start its daemon (prted) in the second container: a
container cannot reach podman itself, so the relay (tests/containers/podman_images.py) does the `podman exec`.
Protocol: one JSON line {"host", "command"} up; output bytes down, then a last line "\\0exit N".
"""

from __future__ import annotations

import json
import os
import socket
import sys

SSH_OPTIONS_WITH_VALUE = set("bcDEeFIiJLlmOopQRSWw")


def split_args(argv: list[str]) -> tuple[str, str]:
    """(host, command) from ssh-style arguments: options (and their values) skipped, user@ dropped."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--":
            i += 1
            break
        i += 2 if len(argv[i]) == 2 and argv[i][1] in SSH_OPTIONS_WITH_VALUE else 1
    if len(argv) - i < 2:
        sys.exit(f"usage: {sys.argv[0]} [ssh-options] HOST COMMAND...")
    return argv[i].rpartition("@")[2], " ".join(argv[i + 1 :])


def main() -> int:
    host, command = split_args(sys.argv[1:])
    path = os.environ.get("HPCRING_RSH_SOCKET", "/run/hpcring-rsh/sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError as exc:
            print(f"{sys.argv[0]}: no relay at {path}: {exc}", file=sys.stderr)
            return 255
        sock.sendall(json.dumps({"host": host, "command": command}).encode() + b"\n")
        tail = b""
        while chunk := sock.recv(65536):
            data = tail + chunk
            # Hold back what could be the start of the status line until more arrives.
            cut = data.rfind(b"\0")
            out, tail = (data, b"") if cut < 0 else (data[:cut], data[cut:])
            sys.stdout.buffer.write(out)
            sys.stdout.flush()
    if not tail.startswith(b"\0exit "):
        print(f"{sys.argv[0]}: relay closed without a status", file=sys.stderr)
        return 255
    return int(tail[len(b"\0exit ") :].strip())


if __name__ == "__main__":
    sys.exit(main())
