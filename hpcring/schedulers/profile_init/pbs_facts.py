"""PBS Pro / OpenPBS: `qstat -Qf` (records `Queue: NAME` followed by indented `key = value` lines; long
values continue on tab-indented lines) and `qstat -Bf` (the server's `default_queue`)."""

from __future__ import annotations

import re

from hpcring.schedulers import walltime
from hpcring.schedulers.profile_init.facts import QueueFact


def _records(text: str, head: str) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        if line.startswith(head):
            out.append((line[len(head) :].strip(), {}))
        elif out and line.startswith("\t"):  # continuation of the previous value
            continue
        elif out and " = " in line:
            key, _, value = line.strip().partition(" = ")
            out[-1][1][key] = value.strip()
    return out


def default_queue(text: str) -> str | None:
    """`default_queue` from `qstat -Bf`."""
    records = _records(text, "Server:")
    return records[0][1].get("default_queue") if records else None


def queues(text: str, default: str | None = None) -> list[QueueFact]:
    """Execution and routing queues with resources_max.walltime and resources_max.nodect."""
    out = []
    for name, attrs in _records(text, "Queue:"):
        wall = attrs.get("resources_max.walltime")
        nodes = attrs.get("resources_max.nodect", "")
        try:
            seconds = walltime.parse(wall) if wall else None
        except ValueError:
            seconds = None
        out.append(QueueFact(name, seconds, int(nodes) if nodes.isdigit() else None, name == default))
    return out


def is_pbs(text: str) -> bool:
    return bool(re.search(r"^Queue:", text, re.MULTILINE))
