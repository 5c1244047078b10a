"""The ranks' records and the verdict on one test: what each rank writes per test phase (inner side), and how
the outer pytest turns every rank's records into one outcome (`judge`; docs/dev/testing.md)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ranked_spec import COLLECT_ENV, REPORTS_ENV, SELECT_ENV, TAIL_LINES, Launch

# --- inner side: one rank's records ----------------------------------------------------------------------


def rank_number() -> int:
    for var in ("HPCRING_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def longrepr_text(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, lineno, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class RankReporter:
    """Appends this rank's records, one JSON object per line, flushed at once (a killed rank keeps them)."""

    def __init__(self, folder: Path, rank: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out = (folder / f"rank{rank}.jsonl").open("a", encoding="utf-8")
        self.write(event="start", rank=rank, pid=os.getpid())

    def write(self, **record: Any) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write(event="collect", nodeid=report.nodeid, longrepr=longrepr_text(report))

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.write(event="begin", nodeid=nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.write(
            event="report",
            nodeid=report.nodeid,
            when=report.when,
            outcome=report.outcome,
            longrepr=longrepr_text(report),
            sections=list(report.sections),
            duration=report.duration,
            wasxfail=getattr(report, "wasxfail", None),
        )

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.write(event="finish", exitstatus=int(exitstatus))
        self.out.close()


class Selection:
    """Keeps only the node ids the outer pytest selected, in collection order."""

    def __init__(self, wanted: Iterable[str]) -> None:
        self.wanted = set(wanted)

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep = [i for i in items if i.nodeid in self.wanted]
        drop = [i for i in items if i.nodeid not in self.wanted]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


class CollectWriter:
    """In a `--collect-only` run: writes the collected ids and the collection errors as JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: list[list[str]] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append([report.nodeid, longrepr_text(report)])

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        items = [[i.nodeid, i.location[1], i.location[2]] for i in session.items]
        self.path.write_text(json.dumps({"items": items, "errors": self.errors}))


def configure_inner(config: pytest.Config) -> None:
    pm = config.pluginmanager
    if os.environ.get(COLLECT_ENV):
        with contextlib.suppress(ImportError):
            import mpi4py

            mpi4py.rc.initialize = False  # a module importing mpi4py.MPI must not start MPI here
        pm.register(CollectWriter(Path(os.environ[COLLECT_ENV])), "ranked-collect")
    if os.environ.get(REPORTS_ENV):
        pm.register(RankReporter(Path(os.environ[REPORTS_ENV]), rank_number()), "ranked-reporter")
    if os.environ.get(SELECT_ENV):
        wanted = json.loads(Path(os.environ[SELECT_ENV]).read_text())
        pm.register(Selection(wanted), "ranked-selection")


# --- outer side: reading the ranks' records and judging one test -----------------------------------------


@dataclass
class RankLog:
    """What one rank wrote: the tests it began, its reports per test and phase, collection errors, its end."""

    begun: list[str] = field(default_factory=list)
    reports: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    collect_errors: list[dict[str, Any]] = field(default_factory=list)
    exitstatus: int | None = None

    @classmethod
    def read(cls, path: Path) -> RankLog:
        log = cls()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # the last line of a rank killed while writing it
            event = rec.get("event")
            if event == "begin":
                log.begun.append(rec["nodeid"])
            elif event == "report":
                log.reports.setdefault(rec["nodeid"], {})[rec["when"]] = rec
            elif event == "collect":
                log.collect_errors.append(rec)
            elif event == "finish":
                log.exitstatus = rec["exitstatus"]
        return log

    def outcome(self, nodeid: str) -> tuple[str, dict[str, Any] | None]:
        """passed, failed, skipped, xfailed, xpassed, incomplete (begun, not finished) or absent; with the
        report that decided it."""
        phases = self.reports.get(nodeid, {})
        for when in ("setup", "call", "teardown"):
            rep = phases.get(when)
            if rep and rep["outcome"] == "failed":
                return "failed", rep
        if "teardown" not in phases:
            return ("incomplete" if nodeid in self.begun or phases else "absent"), None
        rep = phases.get("call") or phases["setup"]
        if rep["outcome"] == "skipped":
            return ("xfailed" if rep.get("wasxfail") is not None else "skipped"), rep
        return ("xpassed" if rep.get("wasxfail") is not None else "passed"), rep


def fmt_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclass
class LaunchResult:
    """A finished launch: its command, exit code, merged output, and every rank's records."""

    launch: Launch
    argv: list[str]
    env: dict[str, str]  # the variables the launch itself set ({tmp} expanded)
    tmp: Path  # the launch's own folder
    returncode: int
    output: str  # stdout and stderr of the launcher, merged, as it printed them
    duration: float
    order: list[str]  # inner ids in run order: as the ranks began them, then the rest of the selection
    logs: dict[int, RankLog]
    extras: dict[str, Any] = field(default_factory=dict)  # what a Site measured
    blamed: bool = False  # an item has already reported this launch's failure

    @property
    def log_file(self) -> Path:
        return self.tmp / "output.log"

    def rank_lines(self, rank: int) -> list[str]:
        prefix = re.compile(rf"^\[{rank}\]<std(?:out|err)>:")
        return [prefix.sub("", line) for line in self.output.splitlines() if prefix.match(line)]

    def launcher_notes(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith("hpcring run:")]

    def dead_rank(self) -> int | None:
        """The rank the launcher saw end badly first ('hpcring run: rank N exited with code C; ...')."""
        for line in self.launcher_notes():
            m = re.match(r"hpcring run: rank (\d+) ", line)
            if m:
                return int(m.group(1))
        return None

    def how_it_ended(self) -> str:
        code = self.returncode
        if code in (124, 137) and self.duration >= self.launch.timeout - 1:
            return f"timed out after {self.launch.timeout} s (exit code {code})"
        if code < 0:
            return f"killed by signal {-code}"
        return f"exit code {code}"

    def first_failure(self) -> tuple[str, list[int]] | None:
        """The first test, in run order, that failed on some rank, and those ranks."""
        for nodeid in self.order:
            ranks = [r for r, log in sorted(self.logs.items()) if log.outcome(nodeid)[0] == "failed"]
            if ranks:
                return nodeid, ranks
        return None

    def crash(self) -> tuple[str, list[int]] | None:
        """The test a rank died in (the rank the launcher saw end first, if its pytest never finished), or
        when no rank died (a timeout), the first test still running anywhere; with those ranks."""
        if self.returncode == 0:
            return None
        dead = self.dead_rank()
        if dead is not None:
            log = self.logs.get(dead)
            if log is None or log.exitstatus is not None or not log.begun:
                return None  # it ended its pytest (-x after a failure), or never began a test
            last = log.begun[-1]
            return (last, [dead]) if log.outcome(last)[0] == "incomplete" else None
        for nodeid in self.order:
            ranks = [r for r, log in sorted(self.logs.items()) if log.outcome(nodeid)[0] == "incomplete"]
            if ranks:
                return nodeid, ranks
        return None

    def root_cause(self) -> tuple[str, str, list[int]] | None:
        """What ended the launch early, whichever came first in run order: ("failure", the first failed
        test, its failing ranks) or ("crash", the test a rank died or hung in, those ranks)."""
        causes = [("failure", *c) for c in [self.first_failure()] if c] + [
            ("crash", *c) for c in [self.crash()] if c
        ]
        pos = {n: i for i, n in enumerate(self.order)}
        return min(causes, key=lambda c: (pos.get(c[1], len(pos)), c[0] == "failure"), default=None)

    def crash_text(self, ranks: Sequence[int]) -> str:
        """The launcher's notes, the rank that died (else the first of `ranks`), its last lines of output."""
        dead = self.dead_rank()
        shown = dead if dead is not None else (ranks[0] if ranks else 0)
        lines = [f"  {n}" for n in self.launcher_notes()[-3:]]
        errors = [(r, e) for r, log in sorted(self.logs.items()) for e in log.collect_errors]
        if errors:
            r, err = errors[0]
            text = err["longrepr"].strip().splitlines()[-TAIL_LINES:]
            lines += [f"collection error on rank {r} ({err['nodeid'] or 'session'}):", *text]
        missing = [r for r in range(self.launch.np) if r not in self.logs]
        if missing:
            lines.append(f"never started pytest: {fmt_ranks(missing)}")
        tail = self.rank_lines(shown)[-TAIL_LINES:]
        other = [line for line in self.output.splitlines() if not line.startswith(("[", "hpcring run:"))]
        if tail:
            lines += [f"last lines of rank {shown}'s output:", *(f"  {line}" for line in tail)]
        elif other:
            lines += ["last lines of the launcher's output:", *(f"  {line}" for line in other[-TAIL_LINES:])]
        lines.append(f"full output: {self.log_file}")
        return "\n".join(lines)


@dataclass
class Verdict:
    outcome: str  # passed, failed, skipped or xfailed
    text: str = ""
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, content) of the failing ranks
    duration: float | None = None  # the slowest rank's call


def judge(result: LaunchResult, nodeid: str, show: Callable[[str], str] = str) -> Verdict:
    """The outer outcome of one inner test from every rank's records (see the module docstring); `show`
    turns an inner id into the name the messages use."""
    np = result.launch.np
    states = {
        r: (result.logs[r].outcome(nodeid) if r in result.logs else ("absent", None)) for r in range(np)
    }
    by_state: dict[str, list[int]] = {}
    for r, (state, _) in states.items():
        by_state.setdefault(state, []).append(r)
    calls = [
        log.reports[nodeid]["call"]["duration"]
        for log in result.logs.values()
        if "call" in log.reports.get(nodeid, {})
    ]
    duration = max(calls) if calls else None

    # An earlier test ended the launch: a rank stopped at its failure (-x) or died in it, and this test did
    # not run, or not to the end, on some rank. The others, going on without that rank, may have failed
    # it, or hung in it until the launcher ended them: only the cause is reported, at its own test.
    running = by_state.get("incomplete", [])
    not_done = sorted(running + by_state.get("absent", []))
    root = result.root_cause()
    if not_done and root is not None and root[1] != nodeid:
        kind, cause, ranks = root
        where = " and ".join(
            f"{what} on {fmt_ranks(by_state[state])}"
            for state, what in (("absent", "not run"), ("incomplete", "not finished"))
            if state in by_state
        )
        went_on = [
            f"{s} on {fmt_ranks(rs)}"
            for s, rs in sorted(by_state.items())
            if s not in ("incomplete", "absent")
        ]
        then = f" (then {'; '.join(went_on)})" if went_on else ""
        if kind == "failure":
            text = f"the launch stopped at its first failure (-x), {show(cause)} on {fmt_ranks(ranks)}"
            return Verdict("skipped", f"{where}: {text}{then}")
        text = f"the launch ended ({result.how_it_ended()}) during {show(cause)}, see there"
        return Verdict("failed", f"{where}: {text}{then}")

    if "failed" in by_state:
        failed = by_state["failed"]
        others = [f"{s} on {fmt_ranks(rs)}" for s, rs in sorted(by_state.items()) if s != "failed"]
        head = f"failed on {fmt_ranks(failed)} of {np}" + (f" ({'; '.join(others)})" if others else "")
        blocks: list[tuple[str, list[int]]] = []  # identical reports are shown once
        sections: list[tuple[str, str]] = []
        for r in failed:
            rep = states[r][1]
            assert rep is not None
            text = (
                rep["longrepr"] if rep["when"] == "call" else f"(error in {rep['when']})\n{rep['longrepr']}"
            )
            same = [b for b in blocks if b[0] == text]
            if same:
                same[0][1].append(r)
            else:
                blocks.append((text, [r]))
            sections += [(f"{title} (rank {r})", content) for title, content in rep["sections"]]
        body = "\n".join(f"{'-' * 12} {fmt_ranks(rs)} {'-' * 12}\n{text}" for text, rs in blocks)
        if root is not None and root[0] == "crash" and root[1] == nodeid:
            body += (
                f"\n{'-' * 12} {fmt_ranks(running)}: not finished ({result.how_it_ended()}) {'-' * 12}\n"
                + result.crash_text(running)
            )
        return Verdict("failed", f"{head}\n{body}", sections, duration)

    if len(by_state) == 1 and states[0][1] is not None:
        state, rep = next(iter(by_state)), states[0][1]
        if state in ("passed", "xpassed"):
            return Verdict("passed", duration=duration)
        if result.launch.no_skips:
            text = f"skipped on every rank ({rep['longrepr']}), in a launch where every test must run"
            return Verdict("failed", text, duration=duration)
        return Verdict(state, rep["longrepr"], duration=duration)
    if set(by_state) <= {"passed", "xpassed", "skipped", "xfailed"}:
        parts = []
        for state, ranks in sorted(by_state.items()):
            rep = states[ranks[0]][1]
            reason = f" ({rep['longrepr']})" if rep and state in ("skipped", "xfailed") else ""
            parts.append(f"{state} on {fmt_ranks(ranks)}{reason}")
        return Verdict("failed", f"the ranks disagree: {'; '.join(parts)}", duration=duration)

    # Not finished on some rank, and nothing earlier explains it: this test is where the launch crashed or
    # timed out, or the launch ended before any test (collection error, launcher failure).
    if result.returncode != 0:
        lead = "the launch ended while this test ran" if running else "not run: the launch ended"
        return Verdict(
            "failed", f"{lead} ({result.how_it_ended()}):\n{result.crash_text(running or not_done)}"
        )
    done = sorted(set(range(np)) - set(not_done))
    text = f"did not run on {fmt_ranks(not_done)}" + (f" (it ran on {fmt_ranks(done)})" if done else "")
    return Verdict("failed", f"{text}, although the launch exited 0; full output: {result.log_file}")
