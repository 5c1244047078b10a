"""The elastic driver: runs worlds one after another until training finishes.

Each world is an ordinary `hpcring run` job (one mpiexec, one supervisor) on the usable hosts, up to
--max-np ranks. When it ends:

- every rank succeeded: the job succeeded;
- ranks failed alike on two or more hosts (or as they did on a host blacklisted before): the script is
  broken, and the job ends at once with its error (verdict.py says which failures are whose);
- a rank failed or its host was lost (its wrapper died, or the node was not heard from for the silence
  timeout, `launch/liveness.py`): that host is blacklisted (with the cooldown), and the next world starts on
  the hosts left once they give at least --min-np slots (waiting up to --elastic-timeout);
- the ranks left for a relaunch (RESET_EXIT_CODE, after the driver announced added or removed hosts): the next
  world starts on the hosts discovered now.

Every relaunch counts against --reset-limit. The workers resume from the newest commit in the node-local
commit store whose directory the driver names (HPCRING_ELASTIC_DIR), so the script does not change.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from hpcring.contracts import elastic as contract
from hpcring.errors import ConfigError
from hpcring.launch.command import LaunchSpec, describe
from hpcring.launch.elastic.discovery import Blacklist, Discovery, is_this_machine
from hpcring.launch.elastic.verdict import Judge, explain
from hpcring.launch.flavour import MpiInstall
from hpcring.launch.hosts import Host
from hpcring.launch.supervisor import Supervisor

SHM = "/dev/shm"


@dataclass(frozen=True)
class ElasticSpec:
    """horovodrun's elastic flags, validated."""

    min_np: int
    max_np: int | None = None
    slots_per_host: int = 1
    discovery_script: str | None = None
    hosts: tuple[Host, ...] = ()
    timeout_s: float = 600.0  # Horovod's default --elastic-timeout
    reset_limit: int | None = None
    cooldown: tuple[float, float] | None = None
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ConfigError(f"--min-np must be at least 1, got {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ConfigError(f"--max-np {self.max_np} is below --min-np {self.min_np}")
        if self.discovery_script is None and not self.hosts:
            raise ConfigError(
                "elastic mode needs hosts to relaunch on: give --host-discovery-script, -H or --hostfile "
                "(on one machine, loopback names play hosts: -H 127.0.0.1:1,127.0.0.2:1,127.0.0.3:1)"
            )
        if self.discovery_script is not None and self.hosts:
            raise ConfigError(
                "give either --host-discovery-script or -H/--hostfile in elastic mode, not both"
            )
        if self.discovery_script is not None and not os.access(self.discovery_script, os.X_OK):
            raise ConfigError(f"--host-discovery-script {self.discovery_script!r} is not an executable file")
        if self.cooldown is not None and not 0 <= self.cooldown[0] <= self.cooldown[1]:
            raise ConfigError(
                f"--blacklist-cooldown-range {self.cooldown[0]:g} {self.cooldown[1]:g}: expected MIN MAX "
                "seconds with 0 <= MIN <= MAX"
            )


def assign(hosts: list[Host], max_np: int | None) -> list[str]:
    """The host of each rank: hosts in order, filled slot by slot (as mpiexec maps by slot), up to max_np."""
    out: list[str] = []
    for host in hosts:
        for _ in range(host.slots):
            if max_np is not None and len(out) >= max_np:
                return out
            out.append(host.name)
    return out


def commit_directory(env: Mapping[str, str]) -> tuple[Path, bool]:
    """(directory for the commit store, whether the driver owns it and removes it at the end)."""
    given = env.get(contract.DIRECTORY)
    if given:
        return Path(given), False
    base = env.get("HPCRING_SHM_DIR") or (SHM if os.access(SHM, os.W_OK) else tempfile.gettempdir())
    return Path(base) / f"hpcring-elastic-{secrets.token_hex(6)}", True


class ElasticDriver:
    """Runs an elastic job; `run()` returns the launcher's exit code."""

    def __init__(
        self,
        install: MpiInstall,
        base: LaunchSpec,
        espec: ElasticSpec,
        *,
        env: Mapping[str, str] | None = None,
        stderr: BinaryIO | None = None,
    ) -> None:
        self.install = install
        self.base = base
        self.espec = espec
        self.env = dict(os.environ if env is None else env)
        self.err = stderr or sys.stderr.buffer
        self.blacklist = Blacklist(espec.cooldown)
        self.discovery = Discovery(
            espec.hosts, espec.discovery_script, espec.slots_per_host, espec.poll_s, self._note
        )
        self.directory, self.owns_directory = commit_directory(self.env)
        self.generation = 0
        self.resets = 0
        self.world: list[str] = []  # host of each rank of the running world
        self.notice_ts = 0
        self.announced: tuple[frozenset[str], frozenset[str]] | None = None
        self.next_poll = 0.0
        self.judge = Judge()

    def _note(self, text: str) -> None:
        self.err.write(f"hpcring run: elastic: {text}\n".encode())
        self.err.flush()

    # ---- hosts --------------------------------------------------------------------------------------------
    def _wait_for_hosts(self) -> list[Host] | None:
        """Usable hosts giving --min-np slots, waiting up to --elastic-timeout; None when it expires."""
        deadline = time.monotonic() + self.espec.timeout_s
        said = False
        while True:
            hosts = self.discovery.hosts(self.blacklist)
            slots = sum(h.slots for h in hosts)
            if slots >= self.espec.min_np:
                return hosts
            if time.monotonic() >= deadline:
                self._note(
                    f"only {slots} slot(s) available ({_listing(hosts)}; "
                    f"blacklisted: {self.blacklist.describe()})"
                    f", fewer than --min-np {self.espec.min_np} for {self.espec.timeout_s:g} s "
                    "(--elastic-timeout); ending the job"
                )
                return None
            if not said:
                self._note(
                    f"waiting up to {self.espec.timeout_s:g} s for --min-np {self.espec.min_np} slots "
                    f"(have {slots}: {_listing(hosts)}; blacklisted: {self.blacklist.describe()}): "
                    f"{self._waiting_for()}"
                )
                said = True
            time.sleep(min(self.espec.poll_s, 0.5))

    def _waiting_for(self) -> str:
        """What can still bring slots: the discovery script, or blacklisted hosts whose cooldown ends."""
        if self.espec.discovery_script is not None:
            return "waiting for the host discovery script to report more"
        if any(not self.blacklist.for_good(h) for h in self.blacklist.names()):
            return "waiting for blacklisted hosts to come back after their cooldown"
        return "a host list without a discovery script: nothing can add slots"

    def _never_enough(self) -> bool:
        """Whether no wait can give --min-np slots: a static host list (no discovery script) whose hosts
        left out of the blacklist for good hold fewer slots."""
        if self.espec.discovery_script is not None:
            return False
        possible = sum(h.slots for h in self.discovery.fixed if not self.blacklist.for_good(h.name))
        return possible < self.espec.min_np

    def _spec_for(self, world: list[str]) -> LaunchSpec:
        """The world's launch: all hosts on this machine collapse to a local launch of len(world) ranks."""
        counts: dict[str, int] = {}
        for name in world:
            counts[name] = counts.get(name, 0) + 1
        local = all(is_this_machine(name) for name in counts)
        hosts = () if local else tuple(Host(n, c) for n, c in counts.items())
        notify = self.directory / f"notify-{self.generation}.json"
        settings = {
            **self.base.settings,
            contract.ELASTIC: "1",
            "HOROVOD_ELASTIC": "1",
            contract.DIRECTORY: str(self.directory),
            contract.GENERATION: str(self.generation),
            contract.NOTIFY: str(notify),
        }
        return replace(self.base, np=len(world), hosts=hosts, settings=settings)

    # ---- while a world runs: announce host changes -------------------------------------------------------
    def _tick(self, sup: Supervisor) -> None:
        now = time.monotonic()
        if now < self.next_poll or not sup.started:
            return
        self.next_poll = now + self.espec.poll_s
        usable = self.discovery.hosts(self.blacklist)
        names = {h.name for h in usable}
        used = set(self.world)
        removed = frozenset(used - names)
        room = self.espec.max_np is None or len(self.world) < self.espec.max_np
        added = frozenset(names - used) if room else frozenset()
        if not (added or removed) or self.announced == (added, removed):
            return
        self.announced = (added, removed)
        self.notice_ts += 1
        result = contract.MIXED if added and removed else contract.ADDED if added else contract.REMOVED
        what = ", ".join([*(f"+{h}" for h in sorted(added)), *(f"-{h}" for h in sorted(removed))])
        self._note(f"hosts changed ({what}); the workers re-form the world at their next commit")
        path = self.directory / f"notify-{self.generation}.json"
        sup.notify({"path": str(path), "notice": contract.Notice(self.notice_ts, result).to_json()})

    # ---- the job ------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run worlds until training ends; a signal between worlds ends the job too, and the commit directory
        is removed however the job ends (during a world the supervisor handles signals itself)."""
        handlers = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            self.discovery.start()
            return self._run()
        except _Interrupted as stop:
            self._note(f"received {signal.Signals(stop.signum).name}; ending the job")
            return 128 + stop.signum
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            self.discovery.stop()
            if self.owns_directory:
                shutil.rmtree(self.directory, ignore_errors=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    def _run(self) -> int:
        while True:
            hosts = self._wait_for_hosts()
            if hosts is None:
                return 1
            self.world = assign(hosts, self.espec.max_np)
            self.announced = None
            self._note(
                f"world {self.generation}: {describe(self.install, len(self.world), _counted(self.world))}"
            )
            sup = Supervisor(
                self.install,
                self._spec_for(self.world),
                env=self.env,
                elastic=True,
                rank_env=lambda r: {contract.HOST: self.world[r]},
                hostname=lambda r: self.world[r],
                on_tick=self._tick,
            )
            rc = sup.run()
            if sup.interrupted is not None or sup.requeue_status is not None:
                return rc  # a signal ended the job, or the ranks checkpointed to be requeued (85/86)
            if sup.failure is None and sup.reset_rank is None and rc == 0:
                return 0
            why = self._account(sup)
            if why is None:
                return sup.failure[2] if sup.failure else (rc or 1)
            if self._never_enough():
                self._note(
                    f"{why}; no slot can come back (host list without a discovery script; blacklisted: "
                    f"{self.blacklist.describe()}), fewer than --min-np {self.espec.min_np}; ending the job "
                    "with the failed rank's exit status"
                )
                return sup.failure[2] if sup.failure else (rc or 1)
            self.resets += 1
            limit = self.espec.reset_limit
            if limit is not None and self.resets > limit:
                self._note(
                    f"{why}; --reset-limit {limit} reached ({limit} relaunch(es) done); ending the job"
                )
                return sup.failure[2] if sup.failure else (rc or 1)
            of = f" of {limit}" if limit is not None else ""
            self._note(f"{why}; relaunching (reset {self.resets}{of})")
            self.generation += 1

    def _account(self, sup: Supervisor) -> str | None:
        """Blacklist the failed rank's host and say what happened; None when the script is to blame (said
        here too) and the job must end."""
        if sup.failure is None:
            if sup.reset_rank is not None:
                return "the workers saved their state for the host change"
            return "the world ended without a rank failing"
        rank, how, _status = sup.failure
        if not 0 <= rank < len(self.world):
            return f"the world failed to start ({how})"
        # A node not heard from (cut off, frozen) goes like a dead one. Ranks elsewhere that failed meanwhile
        # are its victims (MPI noticed the lost peer first): their hosts stay.
        lost = sorted({r for ranks in sup.lost.values() for r in ranks if 0 <= r < len(self.world)})
        if sup.failures and not lost:
            verdict = self.judge.judge(sup.failures, self.world, self.generation)
            if verdict.script:
                self._note(explain(verdict, self.generation))
                return None
        notes = []
        for host in dict.fromkeys(self.world[r] for r in (lost or [rank])):
            delay = self.blacklist.add(host)
            until = "for good" if delay is None else f"for {delay:.0f} s"
            first = min(r for r in (lost or [rank]) if self.world[r] == host)
            what = how if first == rank else "was on a node not heard from"
            notes.append(f"host {host} (rank {first}, which {what}) is blacklisted {until}")
        if lost and rank not in lost:
            notes.append(f"rank {rank} {how} after losing its peers; its host stays")
        return "; ".join(notes)


class _Interrupted(Exception):
    """A signal arrived while no world was running."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _counted(world: list[str]) -> list[Host]:
    counts: dict[str, int] = {}
    for name in world:
        counts[name] = counts.get(name, 0) + 1
    return [Host(n, c) for n, c in counts.items()]


def _listing(hosts: list[Host]) -> str:
    return ",".join(h.spec() for h in hosts) or "no hosts"
