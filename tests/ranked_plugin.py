"""Ranked tests as ordinary pytest items: every test under `tests/ranked`, run on every rank of a real job.

The files under `tests/ranked` are pytest files that run inside every rank of a job started by `hpcring run`.
The launches are declared as data in `tests/ranked/launches.py` (`Launch`: which files, how many ranks, which
MPI flavour, emulated nodes, environment, timeout). This plugin, registered by `tests/conftest.py`, has two
sides, chosen by HPCRING_RANKED:

Outer (the developer's or CI's pytest). `tests/ranked` is collected by `RankedTree`, which yields one item
per (ranked test, launch), named after the inner test and the launch:
`tests/ranked/engine/test_engine_negotiation.py::test_x[openmpi-np4]`, or `...::test_y[fp16][openmpi-np2]`
when the inner test is parametrized. The first item of a launch to run starts the launch, once, under a
`timeout`, with only the selected items' inner ids (so `-k`, `--lf` or one node id launch only what is
needed); every rank writes a JSON line per test phase; each item then reports its own outcome from those
lines (`judge`): passed when it passed on every rank, skipped when skipped on every rank, failed when it
failed on any rank (showing only the failing ranks' tracebacks and captured output, named by rank) or when
the ranks disagree. The ranks run with `-x`: a mismatched collective after a failure could hang the other
ranks, so a test not run because an earlier one failed is skipped, naming that test. A launch that crashed
or timed out fails the test it was running with the exit code, the rank that died and that rank's last
lines of output, and the tests it never reached with one line pointing there. A launch that exits non-zero
while every test passed fails the teardown of its last item.

Inner (a rank, HPCRING_RANKED=1): when HPCRING_RANKED_REPORTS is set, `RankReporter` appends the rank's
records to `rank<N>.jsonl` there; HPCRING_RANKED_SELECT names a JSON list of node ids to keep; with
HPCRING_RANKED_COLLECT, a `--collect-only` run writes the collected ids (`CollectWriter`).

How the outer learns the inner ids: one `pytest --collect-only` subprocess per Python environment (the Open
MPI venv, and the MPICH venv for the MPICH launches), started once per session, in parallel, only when
`tests/ranked` is collected, and only over the ranked paths the command line names. Collecting in the outer
process itself would import the ranked modules and their conftests there: one of them imports `mpi4py.MPI` at
module level, which would make the outer pytest an MPI singleton whose OMPI_/PMIX_ environment then leaks into
every launch, and another sets HPCRING_CPU_DEVICE_PLANE. A static (AST) reading is not enough either:
parametrizations are computed (case tables, dtype lists). The subprocess sets `mpi4py.rc.initialize = False`,
so even its own collection never starts MPI. The rule this relies on: a ranked module's collection must not
depend on the launch (its world size or environment); it computes its expectations at run time. A test
collected in a launch but not in the collect-only run fails the launch's last item; one missing from a launch
fails as "not run".

The launches get the environment the outer pytest started with (`START_ENV`, copied when this module is
imported, before any test module), not whatever the outer tests set later.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import support
from _pytest import nodes

START_ENV = dict(os.environ)

REPORTS_ENV = "HPCRING_RANKED_REPORTS"
SELECT_ENV = "HPCRING_RANKED_SELECT"
COLLECT_ENV = "HPCRING_RANKED_COLLECT"
RANKED_DIR = "tests/ranked"
TAIL_LINES = 12  # of a rank's output, in a crash report


def inner() -> bool:
    """Are we one rank of a launched job (or its collect-only run)?"""
    return os.environ.get("HPCRING_RANKED") == "1"


# --- the declaration -------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Launch:
    """One run of ranked test files under `hpcring run`.

    `paths` are files or folders under tests/ranked. `env` values may name the launch's own folder as
    `{tmp}`. `requires` lists modules the outer environment must import, else the launch is skipped (as
    `pytest.importorskip` did). `site` is `path/to/module.py:Factory`, a `Site` that places the ranks
    (the network-namespace cluster). `no_skips`: a test skipped in this launch fails (the launch exists to
    run the tests that other launches skip).
    """

    paths: tuple[str, ...]
    np: int
    flavour: str = "openmpi"
    emulate_nodes: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pytest_args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    timeout: int = 240
    requires: tuple[str, ...] = ()
    markers: tuple[str, ...] = ("mpi",)
    site: str | None = None
    no_skips: bool = False
    name: str = ""

    @property
    def id(self) -> str:
        """The item suffix: `openmpi-np4`, `mpich-np4-2nodes`, or the explicit name."""
        if self.name:
            return self.name
        nodes_part = f"-{self.emulate_nodes}nodes" if self.emulate_nodes else ""
        return f"{self.flavour}-np{self.np}{nodes_part}"

    @property
    def key(self) -> str:
        """Unique in the table: `<first folder>/<id>`, e.g. `torch_ops/openmpi-np4-2nodes`."""
        return f"{self.paths[0].split('/')[0]}/{self.id}"


class Site(Protocol):
    """Where a launch's ranks run when not all on this machine's one network stack (see Launch.site)."""

    def skip_reason(self, launch: Launch) -> str | None: ...

    def prepare(self, launch: Launch) -> tuple[list[str], list[str], dict[str, str]]:
        """Bring the site up if needed; (command prefix, launcher arguments, environment) for the launch."""
        ...

    def finished(self, launch: Launch, result: LaunchResult) -> None:
        """After the launch: may record measurements in result.extras."""
        ...

    def close(self) -> None: ...


def uses_launches(*keys: str) -> pytest.MarkDecorator:
    """Parametrize an outer test over launches: its `ranked_launch` argument is each launch's result.

    The launch runs once per session, shared with its ranked items; a launch an outer test asks for runs
    all of its tests, whatever else is selected."""
    return pytest.mark.parametrize(
        "ranked_launch", keys, indirect=True, ids=[k.split("/", 1)[1] for k in keys]
    )


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


# --- outer side: the session's launches ------------------------------------------------------------------


def load_module(path: Path, name: str) -> Any:
    """Import a file by path as `name`, reusing the module when that file is already imported so."""
    mod = sys.modules.get(name)
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve() == path.resolve():
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def flavour_python(flavour: str) -> str:
    return support.flavour_python_path(flavour)


class CollectRun:
    """`pytest --collect-only` of some ranked paths in one Python environment, started at once, in the
    background; `result()` waits: (inner items as (node id, line, domain), errors by node id)."""

    def __init__(self, python: str, paths: list[str], root: Path, tmp: Path) -> None:
        self.python, self.out = python, tmp / "collected.json"
        env = {**START_ENV, "HPCRING_RANKED": "1", COLLECT_ENV: str(self.out), "PYTHONUNBUFFERED": "1"}
        argv = [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths]
        self.proc = subprocess.Popen(
            ["timeout", "-k", "5", "300", *argv],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self.data: dict[str, Any] | None = None

    def result(self) -> tuple[list[tuple[str, int | None, str]], dict[str, str]]:
        if self.data is None:
            output, _ = self.proc.communicate()
            if self.proc.returncode not in (0, 1, 2, 5) or not self.out.exists():
                tail = "\n".join(output.splitlines()[-30:])
                raise nodes.Collector.CollectError(
                    f"collecting the ranked tests with {self.python} failed (exit code "
                    f"{self.proc.returncode}):\n{tail}"
                )
            self.data = json.loads(self.out.read_text())
        return [tuple(i) for i in self.data["items"]], dict(self.data["errors"])  # type: ignore[misc]


@dataclass
class Planned:
    """One outer item to be: its launch, the inner id (None: one stand-in for a launch that cannot even be
    collected here), where the inner test is, and why it is skipped if it is."""

    launch: Launch
    inner: str | None
    lineno: int | None = None
    domain: str = ""
    skip: str | None = None


class RankedSession:
    """The session's view of the ranked tests: the table, the collect-only runs, the launches' results."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.root = Path(config.rootpath)
        self.ranked = self.root / RANKED_DIR
        self.launches: list[Launch] = list(
            load_module(self.ranked / "launches.py", "ranked_launches").LAUNCHES
        )
        keys = [la.key for la in self.launches]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        assert not dupes, f"{RANKED_DIR}/launches.py: launches {dupes} share a key (give one a name)"
        self.by_key = {la.key: la for la in self.launches}
        self.results: dict[str, LaunchResult] = {}
        self.broken: dict[str, str] = {}  # launches that could not even start: why
        self.sites: dict[str, Site] = {}
        self.wanted_whole: set[str] = set()  # launches an outer test asks for: they run all their tests
        self.pending: dict[str, int] = {}  # selected items not yet torn down, per launch
        self.items: list[pytest.Item] = []  # the session's items, once collected
        self.complete: set[str] = set()  # launches whose every test was collected
        self._plan: tuple[dict[Path, list[Planned]], dict[Path, str]] | None = None

    @classmethod
    def of(cls, config: pytest.Config) -> RankedSession:
        if SESSION not in config.stash:
            config.stash[SESSION] = cls(config)
        return config.stash[SESSION]

    def tmp(self, name: str) -> Path:
        factory: pytest.TempPathFactory = self.config._tmp_path_factory  # type: ignore[attr-defined]
        return factory.mktemp(name)

    def site(self, launch: Launch) -> Site | None:
        if launch.site is None:
            return None
        if launch.site not in self.sites:
            file, _, attr = launch.site.partition(":")
            path = self.root / file
            self.sites[launch.site] = getattr(load_module(path, path.stem), attr)()
        return self.sites[launch.site]

    def missing_module(self, launch: Launch) -> str | None:
        for module in launch.requires:
            if importlib.util.find_spec(module) is None:
                return f"could not import '{module}'"
        return None

    def skip_reason(self, launch: Launch) -> str | None:
        """Why the launch cannot run here (all known before it runs), or None."""
        reason = self.missing_module(launch) or support.missing_flavour(launch.flavour)
        site = self.site(launch)
        return reason or (site.skip_reason(launch) if site is not None else None)

    def arg_paths(self) -> list[Path]:
        """The paths named on the command line (the test paths when none was)."""
        base = Path(self.config.invocation_params.dir)
        paths = [Path(os.path.abspath(base / arg.split("::")[0])) for arg in self.config.args]
        return paths if paths and all(p.exists() for p in paths) else [self.root]

    def targets(self, launch: Launch) -> list[Path]:
        """What of the launch's paths the command line asks for: a path, or a file or folder inside one."""
        out: list[Path] = []
        for p in (self.ranked / q for q in launch.paths):
            assert p.exists(), f"{RANKED_DIR}/launches.py: {launch.key} names {p}, which does not exist"
            for arg in self.arg_paths():
                if arg == p or p in arg.parents:
                    out.append(arg)
                elif arg in p.parents:
                    out.append(p)
        return list(dict.fromkeys(t for t in out if not any(o in t.parents for o in out)))

    def plan(self) -> tuple[dict[Path, list[Planned]], dict[Path, str]]:
        """Items per ranked file (launches in table order, then inner order) and collection errors per
        path. One collect-only run per Python environment, of what the command line asks for; a launch
        whose environment is missing takes its ids from the main one (its items are skipped), one whose
        required module is missing gets one skipped stand-in per file."""
        if self._plan is not None:
            return self._plan
        reasons = {la.key: self.skip_reason(la) for la in self.launches}

        def python(la: Launch) -> str:
            py = flavour_python(la.flavour)
            return py if Path(py).exists() else sys.executable

        targets = {la.key: self.targets(la) for la in self.launches}
        self.complete = {
            la.key for la in self.launches if all(self.ranked / q in targets[la.key] for q in la.paths)
        }
        by_python: dict[str, set[Path]] = {}
        for la in self.launches:
            if self.missing_module(la) is None:
                by_python.setdefault(python(la), set()).update(targets[la.key])
        runs = {}
        for py, wanted in by_python.items():
            paths = sorted(
                str(t.relative_to(self.root)) for t in wanted if not any(o in t.parents for o in wanted)
            )
            if paths:
                runs[py] = CollectRun(py, paths, self.root, self.tmp("collect"))
        planned: dict[Path, list[Planned]] = {}
        errors: dict[Path, str] = {}
        for la in self.launches:
            mine = targets[la.key]
            if not mine:
                continue
            if self.missing_module(la) is not None:
                for m in mine:
                    for f in sorted(m.rglob("test_*.py")) if m.is_dir() else [m]:
                        planned.setdefault(f, []).append(Planned(la, None, skip=reasons[la.key]))
                continue
            items, errs = runs[python(la)].result()
            for nodeid, text in errs.items():
                path = self.root / nodeid.split("::")[0]
                if any(path == m or m in path.parents or path in m.parents for m in mine):
                    errors.setdefault(
                        path, f"collecting in the {la.flavour} environment ({python(la)}):\n{text}"
                    )
            for nodeid, lineno, domain in items:
                path = self.root / nodeid.split("::")[0]
                if any(path == m or m in path.parents for m in mine):
                    planned.setdefault(path, []).append(Planned(la, nodeid, lineno, domain, reasons[la.key]))
        self._plan = planned, errors
        return self._plan

    def every_id(self, launch: Launch) -> list[str]:
        """Every inner id of the launch that was collected (all of them if the launch is in `complete`)."""
        if self._plan is None:
            return []
        return [p.inner for ps in self._plan[0].values() for p in ps if p.launch is launch and p.inner]

    def selection(self, launch: Launch) -> list[str] | None:
        """The inner ids to run: the selected items', or None for all (also when an outer test asks for
        the launch: it needs every test to have run)."""
        if launch.key in self.wanted_whole:
            return None
        chosen = [i.inner for i in self.items if isinstance(i, RankedItem) and i.launch is launch and i.inner]
        return chosen or None

    def result(self, launch: Launch) -> LaunchResult:
        if launch.key in self.broken:
            raise RuntimeError(f"launch {launch.key} could not start: {self.broken[launch.key]}")
        if launch.key not in self.results:
            try:
                self.results[launch.key] = self.run(launch)
            except Exception as exc:
                self.broken[launch.key] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self.release_site(launch)
        return self.results[launch.key]

    def run(self, launch: Launch) -> LaunchResult:
        """One launch of the real launcher, under `timeout`, running the selected inner ids on every rank."""
        tmp = self.tmp(f"launch-{launch.key.replace('/', '-')}")
        selected = self.selection(launch)
        py = flavour_python(launch.flavour)
        tbstyle = self.config.getoption("tbstyle", "auto")
        # tee-sys: a test's prints are in its report and in the launcher's output, where a crash shows them
        inner_cmd = [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--capture=tee-sys"]
        inner_cmd += [*([f"--tb={tbstyle}"] if tbstyle != "auto" else []), *launch.pytest_args]
        inner_cmd += [f"{RANKED_DIR}/{p}" for p in launch.paths]
        own_env = {k: v.replace("{tmp}", str(tmp)) for k, v in launch.env.items()}
        env = {
            **START_ENV,
            "HPCRING_RANKED": "1",
            "PYTHONUNBUFFERED": "1",
            "HPCRING_TEST_BASETEMP": str(tmp / "ranks"),
            REPORTS_ENV: str(tmp / "reports"),
            **own_env,
        }
        if selected is not None:
            (tmp / "select.json").write_text(json.dumps(selected))
            env[SELECT_ENV] = str(tmp / "select.json")
        prefix: list[str] = []
        site_args: list[str] = []
        site = self.site(launch)
        if site is not None:
            prefix, site_args, site_env = site.prepare(launch)
            env.update(site_env)
        argv = [*prefix, py, "-m", "hpcring", "run", "-np", str(launch.np), "--mpi", launch.flavour]
        argv += ["--emulate-nodes", str(launch.emulate_nodes)] if launch.emulate_nodes else []
        argv += [*launch.launcher_args, *site_args, "--", *inner_cmd]
        t0 = time.monotonic()
        proc = subprocess.run(
            ["timeout", "-k", "5", str(launch.timeout), *argv],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
        took = time.monotonic() - t0
        (tmp / "output.log").write_text(f"$ {' '.join(argv)}\n{proc.stdout}")
        logs = {int(f.stem[4:]): RankLog.read(f) for f in (tmp / "reports").glob("rank*.jsonl")}
        # Run order: as the ranks began the tests (all in the same order), then those none began.
        order: list[str] = []
        for log in sorted(logs.values(), key=lambda lg: -len(lg.begun)):
            order += [n for n in log.begun if n not in order]
        order += [n for n in (selected if selected is not None else self.every_id(launch)) if n not in order]
        result = LaunchResult(launch, argv, own_env, tmp, proc.returncode, proc.stdout, took, order, logs)
        if site is not None:
            site.finished(launch, result)
        return result

    def release_site(self, launch: Launch) -> None:
        """Close the launch's site once no launch of this session that still has to run uses it."""
        if launch.site is None or launch.site not in self.sites:
            return
        wanted = {i.launch.key for i in self.items if isinstance(i, RankedItem)} | self.wanted_whole
        users = {la.key for la in self.launches if la.site == launch.site and la.key in wanted}
        if all(k in self.results or k in self.broken for k in users):
            self.sites.pop(launch.site).close()

    def close(self) -> None:
        for site in self.sites.values():
            site.close()
        self.sites.clear()


SESSION = pytest.StashKey[RankedSession]()


# --- outer side: the collection tree and the items -------------------------------------------------------


class RankedTree(nodes.FSCollector):
    """A folder of tests/ranked. Not a pytest.Directory: collecting one of those loads the folder's
    conftest.py files, which belong to the ranks, not to the outer process."""

    def collect(self) -> Iterator[nodes.Node]:
        planned, errors = RankedSession.of(self.config).plan()
        if self.path in errors:
            raise self.CollectError(errors[self.path])
        children = {
            self.path / p.relative_to(self.path).parts[0]
            for p in [*planned, *errors]
            if self.path in p.parents
        }
        for child in sorted(children):
            cls = RankedFile if child.suffix == ".py" else RankedTree
            yield cls.from_parent(self, path=child)


class RankedFile(nodes.File):
    """A ranked test file: one item per (inner test, launch), grouped by launch in table order."""

    def collect(self) -> list[nodes.Node]:
        planned, errors = RankedSession.of(self.config).plan()
        if self.path in errors:
            raise self.CollectError(errors[self.path])
        top: list[nodes.Node] = []
        groups: dict[tuple[str, ...], RankedGroup] = {}
        for p in planned.get(self.path, []):
            if p.inner is None:
                top.append(RankedItem.from_parent(self, name=p.launch.id, planned=p))
                continue
            *classes, func = p.inner.split("::")[1:]
            parent: nodes.Collector = self
            siblings = top
            for i, cls_name in enumerate(classes):
                key = tuple(classes[: i + 1])
                if key not in groups:
                    groups[key] = RankedGroup.from_parent(parent, name=cls_name)
                    siblings.append(groups[key])
                parent, siblings = groups[key], groups[key].children
            siblings.append(RankedItem.from_parent(parent, name=f"{func}[{p.launch.id}]", planned=p))
        return top


class RankedGroup(nodes.Collector):
    """A test class of a ranked file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children: list[nodes.Node] = []

    def collect(self) -> list[nodes.Node]:
        return self.children


class RankedTestFailed(Exception):
    """An inner test failed, or never ran: the message is the whole report."""


class RankedItem(pytest.Item):
    """One inner test under one launch: it reports what the ranks reported."""

    def __init__(self, *, planned: Planned, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launch = planned.launch
        self.inner = planned.inner
        self.planned = planned
        self.verdict: Verdict | None = None
        for mark in planned.launch.markers:
            self.add_marker(mark)
        self.add_marker(pytest.mark.timeout(planned.launch.timeout + 60))
        if planned.skip:
            self.add_marker(pytest.mark.skip(reason=planned.skip))

    def show(self, inner: str) -> str:
        return f"{inner}[{self.launch.id}]"

    def setup(self) -> None:
        RankedSession.of(self.config).result(self.launch)  # the launch's first item starts it

    def runtest(self) -> None:
        result = RankedSession.of(self.config).result(self.launch)
        assert self.inner is not None
        self.verdict = verdict = judge(result, self.inner, self.show)
        if verdict.outcome == "passed":
            return
        if verdict.outcome == "skipped":  # reported at the test's own line, as a skip mark is
            raise pytest.skip.Exception(verdict.text, _use_item_location=True)
        if verdict.outcome == "xfailed":
            pytest.xfail(verdict.text)
        result.blamed = True
        for title, content in verdict.sections:
            # "Captured stdout call (rank 1)" is shown as "Captured stdout (rank 1) call"
            words = title.split()
            if len(words) >= 3 and words[0] == "Captured":
                self.add_report_section(words[2], " ".join([words[1], *words[3:]]), content)
            else:
                self.add_report_section("call", title, content)
        raise RankedTestFailed(verdict.text)

    def teardown(self) -> None:
        """After the launch's last selected item: the launch itself must have ended cleanly."""
        state = RankedSession.of(self.config)
        key = self.launch.key
        state.pending[key] = state.pending.get(key, 1) - 1
        if state.pending[key] > 0 or key not in state.results:
            return
        result = state.results[key]
        extra: list[str] = []
        if key in state.complete:
            extra = sorted(
                {n for log in result.logs.values() for n in log.reports} - set(state.every_id(self.launch))
            )
        problems = []
        if extra:
            problems.append(
                "the ranks ran tests that the collect-only run did not list (a ranked module's collection "
                f"must not depend on the launch): {', '.join(extra)}"
            )
        if result.returncode != 0 and not result.blamed:
            problems.append(f"every test ended well, but the launch did not ({result.how_it_ended()}):")
            problems.append(result.crash_text([]))
        if problems:
            raise RankedTestFailed(f"launch {key}: " + "\n".join(problems))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, RankedTestFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int, str]:
        """Where the inner test is (a stand-in: the file's top; a skip mark's report needs a line)."""
        if self.inner is None:
            return self.path, 0, self.name
        return self.path, self.planned.lineno or 0, f"{self.planned.domain}[{self.launch.id}]"


# --- hooks -----------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if inner():
        configure_inner(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: nodes.Collector) -> nodes.Collector | None:
    if inner() or path != Path(parent.config.rootpath) / RANKED_DIR:
        return None
    return RankedTree.from_parent(parent, path=path)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the items are final: count each launch's items (its last one checks the launch's exit), and
    let outer tests parametrized over launches (`uses_launches`) have their launches run whole, with time."""
    if inner():
        return
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        key = callspec.params.get("ranked_launch") if callspec is not None else None
        state = (
            RankedSession.of(session.config) if key is not None else session.config.stash.get(SESSION, None)
        )
        if state is None:
            continue
        if isinstance(item, RankedItem) and item.get_closest_marker("skip") is None:
            state.pending[item.launch.key] = state.pending.get(item.launch.key, 0) + 1
        if key in state.by_key:
            state.wanted_whole.add(key)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(state.by_key[key].timeout + 120))
    state = session.config.stash.get(SESSION, None)
    if state is not None:
        state.items = list(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    verdict = item.verdict if isinstance(item, RankedItem) and call.when == "call" else None
    if verdict is not None and verdict.duration is not None:
        report.duration = verdict.duration  # the slowest rank's, not the wait for the launch
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(SESSION, None)
    if state is not None:
        state.close()


@pytest.fixture
def ranked_launch(request: pytest.FixtureRequest) -> LaunchResult:
    """The result of the launch named by the test's parameter (see `uses_launches`)."""
    state = RankedSession.of(request.config)
    key = request.param
    if key not in state.by_key:
        raise LookupError(f"no launch {key!r} in {RANKED_DIR}/launches.py; there are {sorted(state.by_key)}")
    reason = state.skip_reason(state.by_key[key])
    if reason:
        pytest.skip(reason)
    return state.result(state.by_key[key])
