"""Whose fault a failed elastic world is: a host's (blacklist it, relaunch without it) or the script's (end
the job now, with its error).

A relaunch helps only when the host was the problem. Horovod blacklists the host of every failed worker and
stops only once every worker of a round failed or every host is blacklisted, so a script that raises on
every rank burns through the hosts (and, with a discovery script, waits out --elastic-timeout) before the
job ends, and never says the script is at fault. Here:

- a rank killed by a signal, a rank whose wrapper was lost, a world that did not start: the host's failure;
- the same error (same exception and message raised at the same line, or the same exit code) from ranks on
  two or more hosts of the world: the script's failure;
- the same error as a failure already blamed on another host in an earlier world: the script's failure (the
  error followed the job to a new host);
- a full disk (report.DISK) on any rank: nobody's, the job ends (a relaunch would fill it again);
- any other error (one host only, seen there first): the host's failure, in doubt, as before; the second
  strike above catches a script whose error shows on one rank only (`if rank == 0: ...`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hpcring.launch.report import DISK, ErrorReport, RankFailure


@dataclass(frozen=True)
class Verdict:
    """What the driver does with a failed world."""

    script: bool  # True: end the job (no host blacklisted)
    host: str | None = None  # the host to blacklist when the host is blamed
    failure: RankFailure | None = None  # the failure the verdict is about
    ranks: tuple[int, ...] = ()  # every rank that failed alike (script) / the failed rank (host)
    hosts: tuple[str, ...] = ()  # their hosts
    earlier: tuple[int, str] | None = None  # (generation, host) where the same error was blamed on a host


@dataclass
class Judge:
    """Judges each failed world in turn, remembering which errors it blamed on which host."""

    blamed: dict[tuple[str, str, str], tuple[int, str]] = field(default_factory=dict)

    def judge(self, failures: Sequence[RankFailure], world: Sequence[str], generation: int) -> Verdict:
        """`failures` in the order they happened; `world`: the host of each rank."""
        first = failures[0]
        full = [
            f for f in failures if f.error is not None and f.error.kind == DISK and 0 <= f.rank < len(world)
        ]
        if full:  # a full disk: nobody's fault a relaunch would cure, and no host to blacklist
            ranks = tuple(sorted(f.rank for f in full))
            return Verdict(True, None, full[0], ranks, tuple(dict.fromkeys(world[r] for r in ranks)))
        if first.error is None or not 0 <= first.rank < len(world):
            host = world[first.rank] if 0 <= first.rank < len(world) else None
            return Verdict(False, host, first, (first.rank,), (host,) if host else ())
        same = [f for f in failures if _alike(f.error, first.error) and 0 <= f.rank < len(world)]
        ranks = tuple(sorted(f.rank for f in same))
        hosts = tuple(dict.fromkeys(world[r] for r in ranks))
        key = first.error.fingerprint()
        earlier = self.blamed.get(key)
        if len(hosts) >= 2 or (earlier is not None and earlier[1] not in hosts):
            return Verdict(True, None, first, ranks, hosts, earlier)
        host = world[first.rank]
        self.blamed.setdefault(key, (generation, host))
        return Verdict(False, host, first, (first.rank,), (host,))


def _alike(a: ErrorReport | None, b: ErrorReport) -> bool:
    return a is not None and a.fingerprint() == b.fingerprint()


def explain(verdict: Verdict, generation: int) -> str:
    """The driver's words for a script's failure: which ranks, where, and the error itself."""
    assert verdict.failure is not None and verdict.failure.error is not None
    error = verdict.failure.error
    ranks = ", ".join(map(str, verdict.ranks))
    hosts = ", ".join(verdict.hosts)
    if error.kind == DISK:
        word = "rank" if len(verdict.ranks) == 1 else "ranks"
        return (
            f"{word} {ranks} on {hosts}: {error.summary}; a full disk, not a host's or the script's fault: "
            "ending the job without relaunching (no host blacklisted)"
        )
    if verdict.earlier is not None and len(verdict.hosts) < 2:
        gen, host = verdict.earlier
        why = (
            f"rank {ranks} on {hosts} failed in world {generation} as a rank on {host} did in world {gen} "
            f"(blacklisted then): the error follows the script"
        )
    else:
        plural = "s" if len(verdict.ranks) > 1 else ""
        why = f"rank{plural} {ranks} on hosts {hosts} failed the same way"
    lines = [
        f"{why}; the script fails, not a host: ending the job without relaunching",
        f"  error: {error.summary}",
    ]
    if error.where:
        lines.append(f"  raised at {error.where}")
    if error.text:
        lines.append(f"  rank {verdict.failure.rank}'s traceback:")
        lines += [f"    {line}" for line in error.text.rstrip().splitlines()]
    return "\n".join(lines)
