"""The bookkeeping of the collective timeout for requests not every rank submitted (engine/unmatched.py):
when the set's rank 0 calls it overdue, what every rank says, and how soon a cached request reaches the table.
The real jobs are in tests/engine/test_engine_unmatched.py."""

from __future__ import annotations

from types import SimpleNamespace

from hpcring.config import EngineSettings
from hpcring.engine import OpType, Signature
from hpcring.engine.engine_state import patience_s
from hpcring.engine.set_state import Entry, SetState
from hpcring.engine.unmatched import describe, overdue, snapshot

HOSTS = {0: "n0", 1: "n0", 2: "n1", 3: "n1", 5: "n2", 7: "n3"}


def make_set(ranks: tuple[int, ...] = (0, 1, 2, 3)) -> SetState:
    topo = SimpleNamespace(comm=None, rank=0, size=len(ranks))
    return SetState(0, ranks, topo, EngineSettings())


def announce(st: SetState, name: str, op: OpType, set_ranks: list[int], first_seen: float) -> None:
    st.table[name] = Entry({r: Signature(name, op) for r in set_ranks}, first_seen)


def test_overdue_once_an_entry_waited_the_timeout_and_never_when_off() -> None:
    st = make_set()
    assert not overdue(st, 100.0, 10.0)  # an empty table
    announce(st, "a", OpType.ALLREDUCE, [0, 1], 95.0)
    assert not overdue(st, 104.9, 10.0)
    assert overdue(st, 105.0, 10.0)
    assert not overdue(st, 1e9, 0.0)  # 0: the timeout is off


def test_the_report_names_who_submitted_what_and_who_submitted_nothing() -> None:
    st = make_set((0, 1, 5, 7))  # a process set: set ranks 0..3 are world ranks 0, 1, 5, 7
    announce(st, "allgather.x", OpType.ALLGATHER, [1], 92.0)
    announce(st, "allreduce.x", OpType.ALLREDUCE, [0], 90.0)
    rows = snapshot(st)
    assert [r.name for r in rows] == ["allreduce.x", "allgather.x"]  # oldest first
    text = describe(rows, st, 101.0, 10.0, HOSTS.__getitem__)
    assert (
        "allreduce 'allreduce.x' (waiting 11.0 s) submitted by rank 0 (host n0), not by ranks 1 (host "
        in text
    )
    assert (
        "allgather 'allgather.x' (waiting 9.0 s) submitted by rank 1 (host n0), not by ranks 0 (host n0)"
        in text
    )
    assert "Ranks 5 (host n2), 7 (host n3) submitted none of these" in text
    assert "process set 0 waited more than 10 s" in text


def test_joined_ranks_are_not_missing_and_long_tables_are_cut() -> None:
    st = make_set()
    st.joined.append(3)
    for i in range(12):
        announce(st, f"t{i:02d}", OpType.ALLREDUCE, [0, 1], float(i))
    text = describe(snapshot(st), st, 20.0, 10.0, HOSTS.__getitem__)
    assert "not by rank 2 (host n1)" in text and "(host n1), 3" not in text
    assert "t07" in text and "t08" not in text and "and 4 more" in text
    assert "Rank 2 (host n1) submitted none of these" in text


def test_a_cached_request_reaches_the_table_within_half_the_first_bound() -> None:
    def patience(**kw: object) -> float | None:
        return patience_s(EngineSettings(**kw))  # type: ignore[arg-type]

    assert patience(stall_check_time_s=60.0, collective_timeout_s=300.0) == 30.0  # as before: the stall check
    assert patience(stall_check_time_s=60.0, collective_timeout_s=10.0) == 5.0  # the timeout comes first
    assert patience(stall_check_disable=True, collective_timeout_s=10.0) == 5.0
    assert patience(stall_check_disable=True, collective_timeout_s=0.0) is None  # neither: never
    assert patience(stall_check_time_s=60.0, collective_timeout_s=0.0) == 30.0
