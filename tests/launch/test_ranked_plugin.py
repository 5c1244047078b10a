"""The ranked plugin (tests/ranked_plugin.py): how the ranks' records become outer outcomes, and, end to end
under the real launcher, that a failing ranked test reads like any pytest failure naming its rank, that a
crash is reported with the exit code and the dying rank's last lines, and that `-k` launches only what it
selects."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from ranked_records import LaunchResult, RankLog, judge
from ranked_spec import Launch
from support import ROOT

A, B, C = (f"tests/ranked/demo/test_demo.py::test_{x}" for x in "abc")


def rep(nodeid: str, when: str, outcome: str, longrepr: str = "", **kw: Any) -> dict[str, Any]:
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "longrepr": longrepr, "sections": [],
            "duration": 0.5, "wasxfail": None, **kw}  # fmt: skip


def log(*tests: tuple[str, str], finished: bool = True, **failures: Any) -> RankLog:
    """A rank's records: (nodeid, outcome) per test, outcome passed/failed/skipped/begun."""
    out = RankLog()
    for nodeid, outcome in tests:
        out.begun.append(nodeid)
        if outcome == "begun":
            out.reports[nodeid] = {"setup": rep(nodeid, "setup", "passed")}
            continue
        phases = {"setup": rep(nodeid, "setup", "skipped" if outcome == "skipped" else "passed", "why not")}
        if outcome != "skipped":
            phases["call"] = rep(nodeid, "call", outcome, "E   assert 1 == 2", **failures)
        phases["teardown"] = rep(nodeid, "teardown", "passed")
        out.reports[nodeid] = phases
    out.exitstatus = (1 if any(o == "failed" for _, o in tests) else 0) if finished else None
    return out


def result(*logs: RankLog, rc: int = 0, output: str = "", duration: float = 5.0, **kw: Any) -> LaunchResult:
    launch = Launch(("demo",), np=len(logs), timeout=60, **kw)
    return LaunchResult(
        launch, [], {}, Path("/launch"), rc, output, duration, [A, B, C], dict(enumerate(logs))
    )


def test_passed_and_skipped_on_every_rank() -> None:
    res = result(log((A, "passed"), (B, "skipped")), log((A, "passed"), (B, "skipped")))
    assert judge(res, A).outcome == "passed"
    assert (judge(res, B).outcome, judge(res, B).text) == ("skipped", "why not")


def test_a_skip_fails_in_a_launch_where_every_test_must_run() -> None:
    res = result(log((A, "skipped")), log((A, "skipped")), no_skips=True)
    verdict = judge(res, A)
    assert verdict.outcome == "failed" and "every test must run" in verdict.text


def test_ranks_that_disagree_fail() -> None:
    verdict = judge(result(log((A, "passed")), log((A, "skipped"))), A)
    assert verdict.outcome == "failed"
    assert verdict.text == "the ranks disagree: passed on rank 0; skipped on rank 1 (why not)"


def test_a_failure_shows_only_the_failing_rank_and_its_output() -> None:
    sections = [["Captured stdout call", "rank 1 says hello\n"]]
    res = result(log((A, "passed")), log((A, "failed"), sections=sections), log((A, "passed")), rc=1)
    verdict = judge(res, A)
    assert verdict.outcome == "failed"
    assert verdict.text.splitlines()[0] == "failed on rank 1 of 3 (passed on ranks 0, 2)"
    assert "E   assert 1 == 2" in verdict.text
    assert verdict.sections == [("Captured stdout call (rank 1)", "rank 1 says hello\n")]


def test_tests_after_the_first_failure_are_skipped_naming_it() -> None:
    """Rank 1 stopped at B (-x); rank 0 went on without it and failed C (a peer was gone)."""
    res = result(log((A, "passed"), (B, "passed"), (C, "failed")), log((A, "passed"), (B, "failed")), rc=1)
    assert judge(res, B).outcome == "failed"
    verdict = judge(res, C, lambda i: f"{i}[np2]")
    assert verdict.outcome == "skipped"
    assert verdict.text == (
        f"not run on rank 1: the launch stopped at its first failure (-x), {B}[np2] on rank 1 "
        "(then failed on rank 0)"
    )


def test_a_crash_names_the_rank_that_died_and_its_last_lines() -> None:
    output = "[0]<stdout>:.\n[1]<stdout>:.\n[1]<stderr>:Segmentation fault in libfoo\n"
    output += "hpcring run: rank 1 was killed by signal 11 (SIGSEGV); ending the other ranks\n"
    res = result(
        log((A, "passed"), (B, "begun"), finished=False),
        log((A, "passed"), (B, "begun"), finished=False),
        rc=139,
        output=output,
    )
    verdict = judge(res, B)
    assert verdict.outcome == "failed"
    assert verdict.text.splitlines()[:4] == [
        "the launch ended while this test ran (exit code 139):",
        "  hpcring run: rank 1 was killed by signal 11 (SIGSEGV); ending the other ranks",
        "last lines of rank 1's output:",
        "  .",
    ]
    assert "  Segmentation fault in libfoo" in verdict.text
    assert judge(res, A).outcome == "passed"
    after = judge(res, C, lambda i: f"{i}[np2]")
    assert after.outcome == "failed"
    assert after.text == f"not run on ranks 0, 1: the launch ended (exit code 139) during {B}[np2], see there"


def test_a_timeout_blames_the_test_every_rank_was_stuck_in() -> None:
    res = result(log((A, "passed"), (B, "begun"), finished=False), log((A, "passed"), (B, "begun"),
                 finished=False), rc=124, duration=61.0)  # fmt: skip
    verdict = judge(res, B)
    assert verdict.text.startswith(
        "the launch ended while this test ran (timed out after 60 s (exit code 124)):"
    )
    assert judge(res, C).text.startswith("not run on ranks 0, 1: the launch ended (timed out after 60 s")


def test_a_launch_that_never_ran_a_test_says_why() -> None:
    broken = RankLog(
        collect_errors=[{"nodeid": "tests/ranked/demo/test_demo.py", "longrepr": "E   ImportError: nope"}]
    )
    broken.exitstatus = 2
    verdict = judge(
        result(broken, RankLog(exitstatus=2), rc=2, output="hpcring run: rank 0 exited with code 2; ..."), A
    )
    assert verdict.outcome == "failed"
    assert verdict.text.startswith("not run: the launch ended (exit code 2):")
    assert (
        "collection error on rank 0 (tests/ranked/demo/test_demo.py):\nE   ImportError: nope" in verdict.text
    )


# --- end to end: a tiny ranked tree under the real launcher ---------------------------------------------

DEMO_LAUNCHES = """
from ranked_spec import Launch

LAUNCHES = (
    Launch(("fails",), np=2, markers=(), timeout=120),
    Launch(("crashes",), np=2, markers=(), timeout=120),
    Launch(("fails",), np=1, markers=(), requires=("no_such_module",), name="needs-a-module"),
)
"""
KEEP_IN_STEP = """
import os
import time
from pathlib import Path


def rank():  # at run time: collection happens outside the job too
    return int(os.environ["HPCRING_RANK"])


def wait_for_rank_0(text):
    \"\"\"Until rank 0's records hold `text`: what a collective would do to keep the ranks in step.\"\"\"
    records = Path(os.environ["HPCRING_RANKED_REPORTS"]) / "rank0.jsonl"
    deadline = time.monotonic() + 60
    while text not in (records.read_text() if records.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
"""
FAILS = """
import pytest
from demo_steps import rank, wait_for_rank_0


def test_passes():
    pass


@pytest.mark.parametrize("x", [1, 2])
def test_fails_on_rank_1(x):
    print(f"rank {rank()} has x={x}")
    if rank() == 1 and x == 2:
        wait_for_rank_0('"event": "finish"')  # rank 0 passes this and the next test, and ends
    assert x == 1 or rank() != 1, "rank 1 disagrees"


def test_after():
    pass
"""
CRASHES = """
import os
import time

from demo_steps import rank, wait_for_rank_0


def test_ok():
    pass


def test_dies_on_rank_1():
    if rank() == 1:
        wait_for_rank_0("test_dies_on_rank_1")
        print("rank 1 is going down", flush=True)
        os._exit(3)
    time.sleep(60)  # as a rank waiting in a collective for the one that died, until the launcher ends it


def test_never():
    pass
"""


@pytest.fixture
def demo(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makefile(".ini", pytest="[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests")
    (pytester.path / "tests" / "conftest.py").write_text('pytest_plugins = ("ranked_plugin",)\n')
    files = {"launches.py": DEMO_LAUNCHES, "fails/test_f.py": FAILS, "crashes/test_c.py": CRASHES}
    files |= {"fails/demo_steps.py": KEEP_IN_STEP, "crashes/demo_steps.py": KEEP_IN_STEP}
    for name, text in files.items():
        path = pytester.path / "tests" / "ranked" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    paths = [str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.delenv("HPCRING_RANKED", raising=False)
    return pytester


@pytest.mark.mpi
def test_failures_and_crashes_read_like_pytest_failures(demo: pytest.Pytester) -> None:
    run = demo.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-v", timeout=600)
    out = run.stdout.str()
    run.assert_outcomes(passed=3, failed=3, skipped=2)
    f = "tests/ranked/fails/test_f.py::"
    c = "tests/ranked/crashes/test_c.py::"
    for line in (
        f"{f}test_passes[openmpi-np2] PASSED",
        f"{f}test_fails_on_rank_1[1][openmpi-np2] PASSED",
        f"{f}test_fails_on_rank_1[2][openmpi-np2] FAILED",
        f"{f}test_after[openmpi-np2] SKIPPED",
        f"{c}test_ok[openmpi-np2] PASSED",
        f"{c}test_dies_on_rank_1[openmpi-np2] FAILED",
        f"{c}test_never[openmpi-np2] FAILED",
        f"{f}needs-a-module SKIPPED",  # one stand-in per file: nothing could be collected
    ):
        assert line in out, out
    # The failure: its rank, its assertion, its captured output; nothing of the rank that passed.
    assert "SKIPPED [1] tests/ranked/fails/test_f.py: could not import 'no_such_module'" in out
    assert "failed on rank 1 of 2 (passed on rank 0)" in out
    assert "AssertionError: rank 1 disagrees" in out
    assert "Captured stdout (rank 1) call" in out and "rank 1 has x=2" in out
    assert "rank 0 has x=2" not in out
    assert (
        f"not run on rank 1: the launch stopped at its first failure (-x), {f}test_fails_on_rank_1[2]"
        "[openmpi-np2] on rank 1 (then passed on rank 0)"
    ) in out
    # The crash: the exit code, the rank that died, its last words; the test it never reached points there.
    assert "the launch ended while this test ran (exit code 3):" in out
    assert "hpcring run: rank 1 exited with code 3; ending the other ranks" in out
    assert "rank 1 is going down" in out
    assert (
        f"not run on ranks 0, 1: the launch ended (exit code 3) during {c}test_dies_on_rank_1[openmpi-np2]"
        in out
    )
    assert len(out) < 12000, "a short report, not the launch's whole output"


@pytest.mark.mpi
def test_k_launches_only_the_selected_tests(demo: pytest.Pytester) -> None:
    run = demo.runpytest_subprocess("-p", "no:cacheprovider", "-k", "test_passes", timeout=600)
    run.assert_outcomes(passed=1, deselected=7)
    basetemp = next(demo.path.glob("runpytest-*"))
    launched = [p.name for p in basetemp.glob("launch-*") if not p.is_symlink()]
    assert launched == ["launch-fails-openmpi-np20"]  # not the crashes launch: none of its tests is selected
    launch = basetemp / "launch-fails-openmpi-np20"
    assert json.loads((launch / "select.json").read_text()) == ["tests/ranked/fails/test_f.py::test_passes"]
    ran = {
        json.loads(line).get("nodeid")
        for line in (launch / "reports" / "rank1.jsonl").read_text().splitlines()
    }
    assert ran - {None} == {"tests/ranked/fails/test_f.py::test_passes"}
