"""Containers of the images ci/build-image.sh builds, started through its `podman` subcommand.

One place holds the podman configuration (storage under /var/tmp/hpcring-podman, runc, capped rlimits: see
the script), so the tests never repeat it. Every container gets a unique name and this session's label, runs
with podman's own `--timeout` as well as a client-side `timeout`, and is removed in a `finally` even when the
client was killed: `--rm` alone does not remove a container whose podman client died.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_IMAGE = ROOT / "ci" / "build-image.sh"
IMAGE = os.environ.get("HPCRING_IMAGE", "localhost/hpcring:cpu")
DEF_IMAGE = os.environ.get("HPCRING_DEF_IMAGE", "localhost/hpcring:sif")
IMAGE_UID = 1000  # the images' `hpc` user (containers/Dockerfile.cpu)
LABEL = "hpcring-test"
# From a reset store the build takes minutes on a calm machine (docs/dev/containers.md has the figures); a
# loaded one can take several times that, and a hang must still end.
BUILD_TIMEOUT = 1500


def skip_reason() -> str | None:
    """Why the podman tests cannot run here, or None."""
    if os.environ.get("HPCRING_TEST_PODMAN") != "1":
        return "image tests are opt-in: set HPCRING_TEST_PODMAN=1 (root; .ci/run sets it; takes minutes)"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "rootful podman and apt-get need root (CI runs as root)"
    return None


def build_image(
    *args: str, timeout: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`ci/build-image.sh ARGS`, killed after `timeout` seconds (its children too: `timeout -k`); `env` is
    added to this process's environment."""
    return subprocess.run(
        ["timeout", "-k", "10", str(timeout), str(BUILD_IMAGE), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def podman(*args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """podman with the build script's storage and settings."""
    return build_image("podman", *args, timeout=timeout)


@dataclass
class Containers:
    """Starts labelled, uniquely named containers and removes them, whatever happens."""

    session: str = field(default_factory=lambda: f"{os.getpid()}")
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def name(self) -> str:
        return f"hpcring-test-{self.session}-{next(self._count)}"

    def options(self, name: str, timeout: int) -> list[str]:
        """Options every container of this session gets: name, label, and podman's own kill timer."""
        return ["--name", name, "--label", f"{LABEL}={self.session}", "--timeout", str(timeout)]

    def run(
        self,
        image: str,
        command: Sequence[str] = (),
        *,
        options: Sequence[str] = (),
        network: str = "none",
        timeout: int = 300,
    ) -> subprocess.CompletedProcess[str]:
        """`podman run --rm --network NETWORK [options] IMAGE [command]`; the container is gone on return."""
        name = self.name()
        argv = ["run", "--rm", "--network", network, *self.options(name, timeout), *options, image, *command]
        try:
            return podman(*argv, timeout=timeout + 30)
        finally:
            self.remove(name)

    def remove(self, *names: str) -> None:
        """Force-remove containers by name; missing ones are fine (`--rm` usually got there first)."""
        if names:
            podman("rm", "--force", "--ignore", "--time", "0", *names, timeout=120)

    def reap_stale(self) -> list[str]:
        """Remove containers left by test sessions that were killed before their teardown (pid gone)."""
        listing = podman(
            "ps",
            "-a",
            "--filter",
            f"label={LABEL}",
            "--format",
            f'{{{{.Names}}}} {{{{index .Labels "{LABEL}"}}}}',
        )
        stale = [
            name
            for name, _, pid in (line.partition(" ") for line in listing.stdout.splitlines())
            if pid != self.session and not (pid.isdigit() and Path(f"/proc/{pid}").exists())
        ]
        self.remove(*stale)
        return stale

    def remove_all(self) -> list[str]:
        """Remove every container this session started that is still there; returns their names."""
        listing = podman("ps", "-a", "--filter", f"label={LABEL}={self.session}", "--format", "{{.Names}}")
        names = listing.stdout.split()
        self.remove(*names)
        return names


RUNTIMES = ("apptainer", "singularity")


@dataclass(frozen=True)
class PodmanCommand:
    """A rendered `RUNTIME exec [flags] IMAGE CMD...` for podman: run options, the image, the command."""

    options: list[str]
    image: str
    command: list[str]
    skipped_binds: list[str]  # binds whose source does not exist on this machine (site paths such as /lustre)


def rank_command(script: str) -> list[str]:
    """The words of the rendered script's rank line from the runtime onwards (`apptainer exec ...`)."""
    for line in script.splitlines():
        if line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue  # not a complete shell line on its own (a heredoc or continued string)
        for i, word in enumerate(words[:-1]):
            if word in RUNTIMES and words[i + 1] == "exec":
                return words[i:]
    raise ValueError("no `apptainer exec` / `singularity exec` line in the rendered script")


def to_podman(words: Sequence[str]) -> PodmanCommand:
    """Translate ONLY the runtime's flags: `--bind SRC[:DST[:OPTS]]` -> `-v`, `--env K=V` -> `-e`, `--nv` and
    `--rocm` dropped (no GPU here). The image and everything after it are kept exactly as rendered; a flag
    without a translation is an error, so a new renderer flag cannot slip through untested."""
    if len(words) < 3 or words[0] not in RUNTIMES or words[1] != "exec":
        raise ValueError(f"expected 'apptainer|singularity exec [flags] IMAGE CMD...', got {list(words)!r}")
    options: list[str] = []
    skipped: list[str] = []
    i = 2
    while i < len(words) and words[i].startswith("-"):
        flag, eq, value = words[i].partition("=")
        i += 1
        if flag in ("--nv", "--rocm"):
            continue
        if flag not in ("--bind", "-B", "--env"):
            raise ValueError(f"no podman translation for runtime flag {words[i - 1]!r}")
        if not eq:
            if i >= len(words):
                raise ValueError(f"{flag} needs a value")
            value, i = words[i], i + 1
        if flag == "--env":
            options += ["-e", value]
            continue
        for spec in value.split(","):  # apptainer accepts a comma-separated list of binds
            src, _, rest = spec.partition(":")
            if not Path(src).exists():
                skipped.append(spec)
                continue
            options += ["-v", f"{src}:{rest or src}"]
    if i >= len(words):
        raise ValueError(f"no image after the runtime flags in {list(words)!r}")
    return PodmanCommand(options, words[i], list(words[i + 1 :]), skipped)


def output(proc: subprocess.CompletedProcess[str]) -> str:
    """Exit status and the tails of both streams, for assertion messages."""
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def writable_dir(path: Path) -> Path:
    """A host directory the image's user (uid 1000) can write to through a bind mount."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, IMAGE_UID, IMAGE_UID)
    return path


def render(image: str, binds: list[str], command: list[str]) -> str:
    """`hpcring render` for one rank on a generic Slurm GPU node, with the image and binds given."""
    argv = [sys.executable, "-m", "hpcring", "render", "--profile", "generic-slurm-gpu", "--nodes", "1"]
    argv += ["--ranks-per-node", "1", "--image", image]
    for bind in binds:
        argv += ["--bind", bind]
    proc = subprocess.run(
        [*argv, "--", *command], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_rendered(
    containers: Containers, tmp_path: Path, image: str, entrypoint: list[str]
) -> tuple[dict[str, object], list[str]]:
    """Render a 1-rank digits job with a bind for its output, run the rank command in the image with podman,
    and return the metrics the rank wrote plus the binds skipped because their source does not exist here."""
    data = writable_dir(tmp_path / "data")
    command = ["python", "/opt/hpcring/examples/train_digits.py", "--epochs", "2"]
    command += ["--json-metrics", "/data/metrics.json"]
    script = render(image, [f"{data}:/data", "/nonexistent-site-fs"], command)
    translated = to_podman(rank_command(script))
    # (plain asserts: this module is not rewritten by pytest, so each says what it compared)
    assert translated.image == image, (translated.image, image)
    assert translated.command == command, (translated.command, command)  # kept exactly as rendered
    assert "/nonexistent-site-fs" in translated.skipped_binds, translated
    proc = containers.run(
        translated.image, translated.command, options=[*translated.options, *entrypoint], timeout=240
    )
    assert proc.returncode == 0, output(proc) + f"\n--- rank line\n{rank_command(script)}"
    return json.loads((data / "metrics.json").read_text()), translated.skipped_binds


class ExecRelay:
    """Host side of in_image/podman_rsh.py, the ssh stand-in inside a container: each request (a host name and
    a command line, over a unix socket bind-mounted into the container) runs as `sh -c COMMAND` in the
    container that plays that host, via `podman exec`; output streams back, then the exit status.

    A container cannot reach podman, and Open MPI's launcher needs an ssh-like agent to start its daemon on
    the second "node"; this is that agent's other half, with every connection served on its own thread.
    """

    def __init__(self, directory: Path, hosts: dict[str, str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)  # the container's user (uid 1000) connects to the socket
        self.path = directory / "sock"
        self.hosts = dict(hosts)
        self.requests: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self.path.chmod(0o777)
        self._server.listen(16)
        self._server.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="podman-rsh-relay", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            request = json.loads(reader.readline())
            host, command = str(request["host"]), str(request["command"])
            self.requests.append((host, command))
            container = self.hosts.get(host)
            if container is None:
                known = ", ".join(sorted(self.hosts))
                conn.sendall(f"podman_rsh: unknown host {host!r} (known: {known})\n\0exit 255\n".encode())
                return
            argv = ["timeout", "-k", "5", "600", str(BUILD_IMAGE), "podman", "exec", container]
            proc = subprocess.Popen(
                [*argv, "sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert proc.stdout is not None
            try:
                while chunk := os.read(proc.stdout.fileno(), 65536):
                    conn.sendall(chunk)
                conn.sendall(f"\0exit {proc.wait()}\n".encode())
            except OSError:  # the agent went away; `timeout` passes SIGTERM on (the container's removal
                proc.terminate()  # at teardown ends whatever still runs inside)
            finally:
                proc.stdout.close()
                proc.wait()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)
