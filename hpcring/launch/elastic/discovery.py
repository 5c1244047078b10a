"""Where an elastic job may run: a fixed host list (-H/--hostfile) or horovodrun's host discovery script,
polled in the background, minus the blacklisted hosts.

The script prints one host per line, `name:slots` or `name` (then `--slots-per-host` slots), as Horovod's.
A script that fails or times out keeps the last good answer and is reported once per distinct message.
"""

from __future__ import annotations

import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcring.errors import ConfigError
from hpcring.launch.hosts import Host, is_local, parse_host_list

SCRIPT_TIMEOUT_S = 30.0


def parse_discovery_output(text: str, slots_per_host: int, where: str) -> list[Host]:
    """Hosts from a discovery script's output; blank lines are skipped."""
    hosts: list[Host] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        item = line if ":" in line else f"{line}:{slots_per_host}"
        hosts += parse_host_list(item)
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where} lists a host twice: {', '.join(names)}")
    return hosts


def run_script(script: str, slots_per_host: int) -> list[Host]:
    """Run the discovery script once; ConfigError with its output when it fails."""
    try:
        out = subprocess.run([script], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--host-discovery-script {script!r} could not run: {exc}") from None
    if out.returncode != 0:
        raise ConfigError(
            f"--host-discovery-script {script!r} exited with code {out.returncode}: "
            f"{out.stderr.strip()[:200]}"
        )
    return parse_discovery_output(out.stdout, slots_per_host, f"--host-discovery-script {script!r}")


def is_this_machine(name: str) -> bool:
    """This machine under any name, loopback addresses included (127.0.0.2 plays a second host in tests)."""
    if is_local(name):
        return True
    try:
        return socket.gethostbyname(name).startswith("127.")
    except OSError:
        return False


@dataclass
class Blacklist:
    """Failed hosts, each out until its cooldown ends (for good without --blacklist-cooldown-range).

    The n-th failure of a host keeps it out for min(hi, lo * 2**(n-1)) seconds plus up to 10% jitter."""

    cooldown: tuple[float, float] | None = None
    clock: Callable[[], float] = time.monotonic
    failures: dict[str, int] = field(default_factory=dict)
    until: dict[str, float] = field(default_factory=dict)

    def add(self, host: str) -> float | None:
        """Blacklist `host`; returns its cooldown in seconds (None: for good)."""
        n = self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown is None:
            self.until[host] = float("inf")
            return None
        lo, hi = self.cooldown
        delay = float(min(hi, lo * 2 ** (n - 1)) * (1 + 0.1 * random.random()))
        self.until[host] = self.clock() + delay
        return delay

    def blocked(self, host: str) -> bool:
        return self.until.get(host, 0.0) > self.clock()

    def names(self) -> list[str]:
        return sorted(h for h in self.until if self.blocked(h))

    def for_good(self, host: str) -> bool:
        """Whether `host` can never come back (blacklisted without a cooldown)."""
        return self.until.get(host, 0.0) == float("inf")

    def describe(self) -> str:
        """The blacklisted hosts and until when: `a for good, b for 12 s`, or `none`."""
        now = self.clock()
        parts = [
            f"{h} for good" if self.for_good(h) else f"{h} for {self.until[h] - now:.0f} s"
            for h in self.names()
        ]
        return ", ".join(parts) or "none"


class Discovery:
    """The current usable hosts, refreshed every `interval_s` by a background thread when a script is used."""

    def __init__(
        self,
        fixed: Sequence[Host] = (),
        script: str | None = None,
        slots_per_host: int = 1,
        interval_s: float = 1.0,
        report: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.fixed = list(fixed)
        self.script = script
        self.slots_per_host = slots_per_host
        self.interval_s = interval_s
        self.report = report
        self._hosts: list[Host] = list(fixed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""

    def start(self) -> None:
        """First discovery now (so the first world can start at once), then in the background."""
        if self.script is None:
            return
        self._poll()
        self._thread = threading.Thread(target=self._loop, name="hpcring-discovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SCRIPT_TIMEOUT_S + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _poll(self) -> None:
        assert self.script is not None
        try:
            hosts = run_script(self.script, self.slots_per_host)
        except ConfigError as exc:
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                self.report(f"host discovery failed (keeping the last answer): {exc}")
            return
        self._last_error = ""
        with self._lock:
            self._hosts = hosts

    def hosts(self, blacklist: Blacklist) -> list[Host]:
        """Discovered hosts that are not blacklisted, in discovery order."""
        with self._lock:
            return [h for h in self._hosts if not blacklist.blocked(h.name)]
