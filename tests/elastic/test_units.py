"""The pieces of elastic training that need no launch: the commit format and store, the sampler's
repartitioning, host discovery output, the blacklist's cooldown, the driver's rank placement and its verdict
on whose fault a failed world is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcring.errors import ConfigError
from hpcring.launch.elastic.discovery import Blacklist, parse_discovery_output
from hpcring.launch.elastic.driver import ElasticSpec, assign
from hpcring.launch.elastic.verdict import Judge, Verdict, explain
from hpcring.launch.hosts import Host
from hpcring.launch.report import ErrorReport, RankFailure
from hpcring.torch.elastic import sampler as sampler_module
from hpcring.torch.elastic import store


def test_a_commit_round_trips_every_dtype_and_nesting(tmp_path: Path) -> None:
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    obj = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "odd": [torch.arange(7, dtype=torch.bfloat16), torch.zeros(0, 4), torch.tensor(True), (1, "x")],
        "epoch": 3,
    }
    seq, back = store.decode(store.encode_bytes(42, obj))
    assert seq == 42 and back["epoch"] == 3 and back["odd"][3] == (1, "x")
    for name, t in obj["model"].items():
        assert torch.equal(back["model"][name], t)
    assert torch.equal(back["odd"][0], obj["odd"][0]) and back["odd"][1].shape == (0, 4)
    assert back["optimizer"]["param_groups"] == obj["optimizer"]["param_groups"]
    for key, per_param in obj["optimizer"]["state"].items():
        for name, value in per_param.items():
            assert torch.equal(back["optimizer"]["state"][key][name], value)


def test_the_store_finds_the_newest_commit_of_any_rank_on_the_node(tmp_path: Path) -> None:
    a, b = store.CommitStore(tmp_path, 0), store.CommitStore(tmp_path, 1)
    assert a.newest() is None
    a.write(3, {"w": torch.ones(2)})
    b.write(5, {"w": torch.full((2,), 5.0)})
    (tmp_path / ".rank-2.123.tmp").write_bytes(b"half a commit")  # a rank killed mid-write
    (tmp_path / "rank-3.commit").write_bytes(b"garbage")
    seq, path = a.newest() or (0, Path())
    assert seq == 5 and path == b.path
    assert torch.equal(store.read(path)[1]["w"], torch.full((2,), 5.0))
    a.write(6, {"w": torch.zeros(2)})  # replaces rank 0's file atomically
    assert a.newest() == (6, a.path) and not list(tmp_path.glob(".rank-0*"))


def test_the_sampler_resumes_mid_epoch_at_another_size_without_repeats_or_gaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3 ranks train 2 global batches, then 2 ranks finish the epoch from the committed count: every sample
    is seen exactly once (96 samples, batch 4: no padding at these sizes)."""
    data = list(range(96))
    seen: list[int] = []

    def take(size: int, state: dict[str, int] | None, batches: int | None) -> dict[str, int]:
        ranks = []
        for r in range(size):
            monkeypatch.setattr(sampler_module, "_world", lambda r=r: (size, r))
            s = sampler_module.ElasticSampler(data, shuffle=True, seed=3)
            if state:
                s.load_state_dict(state)
            ranks.append((s, list(iter(s))))
        n = batches if batches is not None else len(ranks[0][1]) // 4
        for s, indices in ranks:
            for b in range(n):
                seen.extend(indices[b * 4 : (b + 1) * 4])
                s.record_batch(b, 4)
        return ranks[0][0].state_dict()

    state = take(3, None, 2)
    assert state == {"epoch": 0, "processed_num": 24}
    take(2, state, None)
    assert sorted(seen) == data


def test_discovery_output_and_its_mistakes() -> None:
    hosts = parse_discovery_output("n1:4\n\nn2\n", slots_per_host=2, where="script")
    assert hosts == [Host("n1", 4), Host("n2", 2)]
    with pytest.raises(ConfigError, match="twice"):
        parse_discovery_output("n1:1\nn1:2\n", 1, "script")
    with pytest.raises(ConfigError, match="invalid host name"):
        parse_discovery_output("bad host!\n", 1, "script")


def test_the_blacklist_backs_off_and_lets_hosts_back() -> None:
    now = [100.0]
    bl = Blacklist((2.0, 5.0), clock=lambda: now[0])
    first = bl.add("n1") or 0.0
    assert 2.0 <= first <= 2.2 and bl.blocked("n1") and bl.names() == ["n1"]
    now[0] += first + 0.01
    assert not bl.blocked("n1")
    second = bl.add("n1") or 0.0
    assert 4.0 <= second <= 4.4
    third = bl.add("n1") or 0.0
    assert 5.0 <= third <= 5.5  # capped at MAX
    forever = Blacklist(None)
    assert forever.add("n2") is None and forever.blocked("n2")


def test_ranks_fill_hosts_slot_by_slot_up_to_max_np() -> None:
    hosts = [Host("a", 2), Host("b", 1), Host("c", 3)]
    assert assign(hosts, None) == ["a", "a", "b", "c", "c", "c"]
    assert assign(hosts, 4) == ["a", "a", "b", "c"]


def test_elastic_spec_refuses_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs hosts"):
        ElasticSpec(min_np=2)
    with pytest.raises(ConfigError, match="below --min-np"):
        ElasticSpec(min_np=3, max_np=2, hosts=(Host("a", 4),))
    with pytest.raises(ConfigError, match="not an executable"):
        ElasticSpec(min_np=1, discovery_script=str(tmp_path / "missing.sh"))
    with pytest.raises(ConfigError, match="MIN MAX"):
        ElasticSpec(min_np=1, hosts=(Host("a", 1),), cooldown=(5.0, 1.0))


def _error(summary: str, where: str = "train.py:3 in main") -> ErrorReport:
    return ErrorReport("exception", summary, where, committed=False)


BUG = _error("AttributeError: module 'torch' has no attribute 'nope'")


def test_the_same_error_on_two_hosts_is_the_scripts() -> None:
    world = ["a", "b", "b"]
    failures = [RankFailure(2, "exited with code 1", 1, BUG), RankFailure(0, "exited with code 1", 1, BUG)]
    verdict = Judge().judge(failures, world, 0)
    assert verdict.script and verdict.ranks == (0, 2) and verdict.hosts == ("a", "b")
    text = explain(verdict, 0)
    assert "ranks 0, 2 on hosts a, b failed the same way" in text and BUG.summary in text
    # the same error on one host only (its two ranks): that host's, in doubt
    alone = Judge().judge([*failures[:1], RankFailure(1, "exited with code 1", 1, BUG)], world, 0)
    assert not alone.script and alone.host == "b"


def test_signals_lost_wrappers_and_errors_on_one_host_blame_the_host() -> None:
    world = ["a", "b"]
    killed = RankFailure(1, "was killed by signal 9 (SIGKILL)", 137)
    assert Judge().judge([killed, RankFailure(0, "exited with code 1", 1, BUG)], world, 0).host == "b"
    lost = RankFailure(0, "lost contact with the launcher (its wrapper died)", 1)
    assert Judge().judge([lost], world, 0) == Verdict(False, "a", lost, (0,), ("a",))
    # different errors on the two hosts: not the same failure, the first one's host is blamed
    other = RankFailure(1, "exited with code 1", 1, _error("RuntimeError: CUDA error: ECC"))
    assert Judge().judge([other, RankFailure(0, "exited with code 1", 1, BUG)], world, 0).host == "b"


def test_an_error_that_follows_the_job_to_another_host_is_the_scripts() -> None:
    """Rank 0 raises in every world (`if rank == 0: bug`): its host is blamed once, then the script."""
    judge = Judge()
    first = judge.judge([RankFailure(0, "exited with code 1", 1, BUG)], ["a", "b", "c"], 0)
    assert not first.script and first.host == "a"
    second = judge.judge([RankFailure(0, "exited with code 1", 1, BUG)], ["b", "c"], 1)
    assert second.script and second.earlier == (0, "a")
    assert "failed in world 1 as a rank on a did in world 0" in explain(second, 1)
    # another error is judged on its own; the same error back on the blamed host (after its cooldown) too
    assert not judge.judge(
        [RankFailure(0, "exited with code 1", 1, _error("OSError: disk"))], ["b"], 2
    ).script
    assert not judge.judge([RankFailure(0, "exited with code 1", 1, BUG)], ["a", "b"], 3).script


def test_exit_codes_without_a_report_compare_by_code() -> None:
    world = ["a", "b"]
    two = [RankFailure(r, "exited with code 2", 2, ErrorReport.for_exit_code(2)) for r in (1, 0)]
    assert Judge().judge(two, world, 0).script
    mixed = [two[0], RankFailure(0, "exited with code 3", 3, ErrorReport.for_exit_code(3))]
    assert not Judge().judge(mixed, world, 0).script
