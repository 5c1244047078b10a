"""Units of the torch transport (hpcring/collective/backends/nccl.py) that need no process group.

The transport itself runs under the real launcher with gloo (tests/ranked/torch_ops/
test_torch_ops_transport.py) and, across fake nodes, in tests/ranked/netns; NCCL cannot run here, so the one
NCCL-only rule, grouping a send with its receive, is checked as the order of calls it makes on the process
group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hpcring.collective.backends.nccl import TorchTransport, announced_host


def test_one_host_rendezvous_on_loopback() -> None:
    assert announced_host(["n1"]) == "127.0.0.1"
    assert announced_host(["n2", "n2", "n2"]) == "127.0.0.1"


def test_several_hosts_rendezvous_at_rank_0s_host_not_the_first_of_the_job() -> None:
    assert announced_host(["n2", "n2", "n1", "n1"]) == "n2"
    assert announced_host(["n1", "n3"]) == "n1"


class _RecordingGroup:
    """Stands in for ProcessGroupNCCL's point-to-point surface only: records the order of calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _group_start(self) -> None:
        self.calls.append("group_start")

    def _group_end(self) -> None:
        self.calls.append("group_end")

    def send(self, tensors: list[Any], dest: int, tag: int) -> Any:
        self.calls.append(f"send->{dest}")
        return self

    def recv(self, tensors: list[Any], source: int, tag: int) -> Any:
        self.calls.append(f"recv<-{source}")
        return self

    def wait(self) -> None:
        self.calls.append("wait")


def _transport(backend: str) -> tuple[TorchTransport, _RecordingGroup]:
    pytest.importorskip("torch")
    t = TorchTransport.__new__(TorchTransport)
    t.backend, t._rank, t._size = backend, 0, 2
    t.pg = pg = _RecordingGroup()
    return t, pg


def test_nccl_sendrecv_posts_both_in_one_group_before_waiting() -> None:
    t, pg = _transport("nccl")
    t.sendrecv(np.zeros(2), 1, np.zeros(2), 1, tag=3)
    assert pg.calls == ["group_start", "recv<-1", "send->1", "group_end", "wait", "wait"]


def test_gloo_needs_no_group() -> None:
    t, pg = _transport("gloo")
    with t.p2p_group():
        t.isend(np.zeros(2), 1, 4)
    assert pg.calls == ["send->1"]


def test_the_group_is_closed_when_posting_fails() -> None:
    t, pg = _transport("nccl")
    with pytest.raises(RuntimeError), t.p2p_group():
        raise RuntimeError("post failed")
    assert pg.calls == ["group_start", "group_end"]
