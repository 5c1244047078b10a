"""Queue limits as the sites document them: node minimum and maximum and the walltime limit of each queue
are profile data, and `hpcring render` refuses a job outside them with exit 2 and one line naming the queue,
the limit and the value.

Pages (read 2026-11-27, cited in the profiles):
- Aurora: https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ ("Queues": Node Min / Node Max / Time Max;
  prod 256-10,624 nodes, debug 1-2, debug-scaling 2-256, capacity 1-16).
- Polaris: https://docs.alcf.anl.gov/polaris/running-jobs/ ("Queues": prod 10-496 nodes, debug 1-2,
  debug-scaling 1-10, preemptable 1-10, capacity 1-4).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sched_helpers import cli

from hpcring.errors import ProfileError, choices
from hpcring.schedulers import profile, walltime

# (queue, node min, node max, time max) straight from each page's "Queues" table.
DOCUMENTED = {
    "aurora": [
        ("debug", 1, 2, "01:00:00"),
        ("debug-scaling", 2, 256, "01:00:00"),
        ("prod", 256, 10624, "24:00:00"),
        ("capacity", 1, 16, "168:00:00"),
    ],
    "polaris": [
        ("debug", 1, 2, "01:00:00"),
        ("debug-scaling", 1, 10, "01:00:00"),
        ("prod", 10, 496, "24:00:00"),
        ("preemptable", 1, 10, "72:00:00"),
        ("capacity", 1, 4, "168:00:00"),
    ],
}
CASES = [(site, *row) for site, rows in DOCUMENTED.items() for row in rows]


def _hours(text: str) -> int:
    return int(text.split(":")[0]) * 3600


def _render(site: str, queue: str, nodes: int, time: str | None = None) -> tuple[int, str]:
    args = ["render", "--profile", site, "--nodes", str(nodes), "--partition", queue, "--account", "P"]
    args += ["--time", time] if time else []
    res = cli(*args, "--", "python", "train.py")
    return res.returncode, res.stderr


@pytest.mark.parametrize(("site", "queue", "lo", "hi", "tmax"), CASES)
def test_profile_holds_the_documented_limits(site: str, queue: str, lo: int, hi: int, tmax: str) -> None:
    part = profile.load(site).site.partition(queue)
    assert part is not None
    assert (part.min_nodes, part.max_nodes, part.max_walltime_s) == (lo, hi, _hours(tmax))


@pytest.mark.parametrize(("site", "queue", "lo", "hi", "tmax"), [c for c in CASES if c[2] > 1])
def test_below_the_node_minimum_is_refused(site: str, queue: str, lo: int, hi: int, tmax: str) -> None:
    code, err = _render(site, queue, lo - 1)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "Traceback" not in err
    assert f"queue {queue!r}" in line and f"{lo}-node minimum" in line and f"{lo - 1} node(s)" in line


@pytest.mark.parametrize(("site", "queue", "lo", "hi", "tmax"), [c for c in CASES if c[3] <= 496])
def test_above_the_node_maximum_is_refused(site: str, queue: str, lo: int, hi: int, tmax: str) -> None:
    code, err = _render(site, queue, hi + 1)
    assert code == 2 and "\n" not in err.strip()
    assert f"queue {queue!r}" in err and f"{hi}-node limit" in err and f"{hi + 1} nodes" in err


@pytest.mark.parametrize(("site", "queue", "lo", "hi", "tmax"), CASES)
def test_the_documented_range_renders(site: str, queue: str, lo: int, hi: int, tmax: str) -> None:
    """Both ends of each queue's range render (at a short walltime, inside every size bin)."""
    for nodes in sorted({lo, min(hi, 512)}):
        code, err = _render(site, queue, nodes, "00:30:00")
        assert code == 0, err


@pytest.mark.parametrize(("site", "queue", "lo", "hi", "tmax"), [c for c in CASES if c[1] != "prod"])
def test_over_the_walltime_limit_is_refused(site: str, queue: str, lo: int, hi: int, tmax: str) -> None:
    over = f"{_hours(tmax) // 3600}:00:01"
    code, err = _render(site, queue, lo, over)
    assert code == 2 and "\n" not in err.strip()
    assert f"queue {queue!r}" in err and "exceeds the limit" in err


def test_aurora_prod_smallest_job_is_256_nodes() -> None:
    """The issue's case: a 2-node job sent to Aurora's prod queue is refused before qsub."""
    code, err = _render("aurora", "prod", 2)
    assert code == 2
    assert "2 node(s) are below the 256-node minimum of queue 'prod' on 'aurora'" in err


@pytest.mark.parametrize("site", sorted(DOCUMENTED))
def test_a_refusal_names_the_queues_that_take_the_job(site: str) -> None:
    """Below prod's minimum: the line ends with every documented queue whose node range holds the job."""
    lo = next(row[1] for row in DOCUMENTED[site] if row[0] == "prod")
    takers = [q for q, mn, mx, _ in DOCUMENTED[site] if mn <= lo - 1 <= mx]
    assert takers, "the case needs a queue that takes the job"
    code, err = _render(site, "prod", lo - 1)
    assert code == 2 and "\n" not in err.strip()
    assert err.strip().endswith(f"; {lo - 1} node(s) fit {choices(takers)} (--partition NAME)"), err


def test_a_refusal_says_when_no_queue_takes_the_job() -> None:
    longest = max(_hours(row[3]) for row in DOCUMENTED["polaris"]) // 3600
    code, err = _render("polaris", "debug", 1, f"{longest + 1}:00:00")
    assert code == 2
    asked = walltime.human((longest + 1) * 3600)
    assert err.strip().endswith(f"no partition, QOS or queue of 'polaris' takes 1 node(s) for {asked}"), err


def test_min_above_max_is_a_profile_error(tmp_path: Path) -> None:
    data = yaml.safe_load(profile.source_of("polaris")[1])
    data["site"]["partitions"][0]["min_nodes"] = 3  # debug: max 2
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"site\.partitions\[0\]\.min_nodes: 3 is above max_nodes 2"):
        profile.load(str(path))
