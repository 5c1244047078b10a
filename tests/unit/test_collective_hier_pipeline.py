"""The hierarchical pipeline's pure parts: how a buffer is cut into segments, when each segment finishes, and
the segment-size knob. The algorithm itself runs in tests/ranked/collective (real MPI, several layouts)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcring.collective import selection
from hpcring.collective.algorithms.hierarchical import (
    DEFAULT_SEGMENT_BYTES,
    IN_FLIGHT_BYTES,
    finish_iteration,
    pipeline_lag,
    segment_count,
)
from hpcring.errors import ConfigError


def test_segment_count_examples() -> None:
    mib = 1 << 20
    assert segment_count(64 * mib, 16 * mib, 4 * mib) == 16
    assert segment_count(64 * mib + 4, 16 * mib + 1, 4 * mib) == 17  # a partial segment still counts
    assert segment_count(4 * mib, mib, 4 * mib) == 1  # up to one segment: no pipeline
    assert segment_count(64 * mib, 16 * mib, 0) == 1  # 0 turns it off
    assert segment_count(40, 10, 1) == 10  # never more segments than items


@given(st.integers(1, 1 << 30), st.sampled_from([1, 2, 4, 8]), st.integers(0, 1 << 24))
def test_segment_count_is_bounded(nbytes_hint: int, itemsize: int, seg_bytes: int) -> None:
    count = max(1, nbytes_hint // itemsize)
    nbytes = count * itemsize
    k = segment_count(nbytes, count, seg_bytes)
    assert 1 <= k <= count
    if seg_bytes > 0 and k > 1:
        assert -(-nbytes // k) <= seg_bytes + itemsize  # segments are at most about seg_bytes


@given(st.integers(0, 200), st.integers(0, 20), st.integers(1, 4))
def test_each_segment_finishes_after_its_cross_steps_and_in_order(segment: int, steps: int, lag: int) -> None:
    """A segment's allgather runs after every one of its cross steps (step s completes in iteration
    segment + lag + s - 1), and segments finish in order, one per iteration: the allgathers never pile up."""
    done = finish_iteration(segment, steps, lag)
    if steps == 0:
        assert done == segment
    else:
        last_step = segment + lag + steps - 1
        assert done == last_step and last_step >= segment + lag
    assert finish_iteration(segment + 1, steps, lag) == done + 1


def test_two_nodes_schedule_matches_the_design() -> None:
    """2 nodes: the cross ring has 2 steps (exchange halves, exchange back); with a lag of one iteration,
    segment k starts in iteration k and is allgathered in iteration k + 2; by default about IN_FLIGHT_BYTES of
    segments may be in flight before the schedule forces a wait."""
    assert [finish_iteration(k, 2, 1) for k in range(4)] == [2, 3, 4, 5]
    assert pipeline_lag(DEFAULT_SEGMENT_BYTES) * DEFAULT_SEGMENT_BYTES == IN_FLIGHT_BYTES
    assert pipeline_lag(IN_FLIGHT_BYTES * 2) == 1  # at least one iteration
    assert pipeline_lag(1000) * 1000 >= IN_FLIGHT_BYTES


def test_segment_bytes_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(selection.SEGMENT_ENV, raising=False)
    assert selection.segment_bytes(123) == 123
    monkeypatch.setenv(selection.SEGMENT_ENV, "0")
    assert selection.segment_bytes(123) == 0
    monkeypatch.setenv(selection.SEGMENT_ENV, "8388608")
    assert selection.segment_bytes(123) == 8 << 20
    for bad in ("-1", "4MiB"):
        monkeypatch.setenv(selection.SEGMENT_ENV, bad)
        with pytest.raises(ConfigError, match=r"HPCRING_HIER_SEGMENT_BYTES.*positive number of bytes, or 0"):
            selection.segment_bytes(123)
