"""A batch allocation's hosts, as `hpcring.run` reads them when given none (hpcring.launch.allocation)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hpcring.cli import run_api
from hpcring.errors import ConfigError
from hpcring.launch.allocation import allocation_hosts, expand_counts, expand_hostlist
from hpcring.launch.hosts import Host


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[1-2,07],login", ["node1", "node2", "node07", "login"]),
        ("gpu[09-11]-ib", ["gpu09-ib", "gpu10-ib", "gpu11-ib"]),
        ("a[1],b[2-3]", ["a1", "b2", "b3"]),
    ],
)
def test_slurm_host_lists_expand(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["node[1-3", "node[a-b]", "r[1-2]n[1-2]"])
def test_slurm_host_lists_it_cannot_read_are_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="Slurm host list"):
        expand_hostlist(text)


def test_slurm_counts_expand() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    with pytest.raises(ConfigError, match="not like '2\\(x3\\),1'"):
        expand_counts("2x3")


def test_slurm_allocation() -> None:
    env = {
        "SLURM_JOB_NODELIST": "cn[01-02]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
    }
    assert allocation_hosts(env) == ("slurm", [Host("cn01", 2), Host("cn02", 2)])
    env = {"SLURM_JOB_NODELIST": "cn[01-02]", "SLURM_JOB_CPUS_PER_NODE": "8,4"}
    assert allocation_hosts(env) == ("slurm", [Host("cn01", 8), Host("cn02", 4)])
    with pytest.raises(ConfigError, match="2 nodes in SLURM_JOB_NODELIST but 1 counts"):
        allocation_hosts({"SLURM_JOB_NODELIST": "cn[01-02]", "SLURM_TASKS_PER_NODE": "2"})


def test_lsf_and_pbs_allocations(tmp_path: Path) -> None:
    assert allocation_hosts({"LSB_MCPU_HOSTS": "hA 4 hB 2 hA 1"}) == ("lsf", [Host("hA", 5), Host("hB", 2)])
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\nn2\nn1\n")
    assert allocation_hosts({"PBS_NODEFILE": str(nodefile)}) == ("pbs", [Host("n1", 3), Host("n2", 1)])
    with pytest.raises(ConfigError, match=r"PBS_NODEFILE .* cannot be read"):
        allocation_hosts({"PBS_NODEFILE": str(tmp_path / "missing")})
    assert allocation_hosts({"HOME": "/root"}) is None


def test_hpcring_run_uses_an_allocation_that_spans_other_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "HPCRING_HOSTS",
        "HPCRING_HOSTFILE",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "LSB_MCPU_HOSTS",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    assert run_api._allocation_flags() == []  # no allocation: this machine
    monkeypatch.setenv("LSB_MCPU_HOSTS", f"{socket.gethostname()} 4")
    assert run_api._allocation_flags() == []  # an allocation of this machine only: the launcher's default
    monkeypatch.setenv("LSB_MCPU_HOSTS", f"{socket.gethostname()} 2 cn7 2")
    assert run_api._allocation_flags() == [f"--hosts={socket.gethostname()}:2,cn7:2"]
    monkeypatch.setenv("HPCRING_HOSTS", "cn8:2")
    assert run_api._allocation_flags() == []  # hpcring run's own variable wins, as it does for the CLI
