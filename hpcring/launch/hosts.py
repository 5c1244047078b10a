"""Host lists for `hpcring run`: `-H n1:2,n2:2` and hostfiles, parsed once into `Host` records.

Both MPI flavours then get the same normalised list (Open MPI `--host n1:2,...`, hydra `-hosts n1:2,...`), so
the two hostfile dialects (`host slots=N` from Open MPI, `host:N` from hydra) are accepted for either.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcring.errors import ConfigError

_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")
_LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})


@dataclass(frozen=True)
class Host:
    """One host and how many ranks it may run."""

    name: str
    slots: int

    def spec(self) -> str:
        """`name:slots`, the form both Open MPI's --host and hydra's -hosts accept."""
        return f"{self.name}:{self.slots}"


def _check_name(name: str, where: str) -> str:
    if not name or not _HOST_RE.match(name):
        raise ConfigError(f"{where}: invalid host name {name!r} (letters, digits, '.', '-', '_' only)")
    return name


def _slots(value: str, where: str) -> int:
    try:
        slots = int(value)
    except ValueError:
        raise ConfigError(f"{where}: slot count {value!r} is not an integer") from None
    if slots <= 0:
        raise ConfigError(f"{where}: slot count must be at least 1, got {slots}")
    return slots


def parse_host_list(text: str) -> list[Host]:
    """Parse `-H n1:2,n2:2` (a host without `:N` has one slot, as with Open MPI's --host)."""
    hosts: list[Host] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"-H {text!r}: empty host entry; expected e.g. 'node1:4,node2:4'")
        name, sep, count = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        if not sep:
            name, count = item, "1"
        hosts.append(Host(_check_name(name, f"-H {text!r}"), _slots(count, f"-H {text!r}")))
    return _merge(hosts, f"-H {text!r}")


def parse_hostfile(path: str | Path) -> list[Host]:
    """Parse a hostfile: lines `host`, `host slots=N` (Open MPI) or `host:N` (hydra); `#` starts a comment."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"hostfile {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {str(p)!r} line {number}"
        words = line.split()
        name, slots = words[0], 1
        if ":" in name and name.count(":") == 1:
            name, count = name.split(":")
            slots = _slots(count, where)
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if key in ("slots", "max_slots", "max-slots") and sep:
                if key == "slots":
                    slots = _slots(value, where)
            else:
                raise ConfigError(f"{where}: unexpected {word!r}; expected 'host slots=N' or 'host:N'")
        hosts.append(Host(_check_name(name, where), slots))
    if not hosts:
        raise ConfigError(f"hostfile {str(p)!r} lists no hosts; expected lines like 'node1 slots=4'")
    return _merge(hosts, f"hostfile {str(p)!r}")


def _merge(hosts: Sequence[Host], where: str) -> list[Host]:
    """A host named twice is a mistake in a host list: MPI launchers treat it inconsistently."""
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise ConfigError(
                f"{where}: host {host.name!r} is listed twice; give it once with its total slots"
            )
        seen.add(host.name)
    return list(hosts)


def is_local(name: str) -> bool:
    """True when `name` is this machine (where oversubscription is ours to allow)."""
    if name in _LOCAL_NAMES:
        return True
    me = socket.gethostname()
    return name in (me, me.split(".")[0])


def check_capacity(np: int, hosts: Sequence[Host]) -> bool:
    """Validate -np against the slots; True when the job oversubscribes (allowed only on localhost)."""
    total = sum(h.slots for h in hosts)
    if np <= total:
        return False
    if all(is_local(h.name) for h in hosts):
        return True
    listing = ", ".join(h.spec() for h in hosts)
    raise ConfigError(
        f"-np {np} is more than the {total} slots of the given hosts ({listing}); "
        f"lower -np or add slots (oversubscription is only allowed on localhost)"
    )
