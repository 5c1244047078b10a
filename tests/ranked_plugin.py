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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest import nodes
from ranked_records import LaunchResult, Verdict, configure_inner, judge
from ranked_session import SESSION, Planned, RankedSession
from ranked_spec import RANKED_DIR, inner

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
