"""detect() for each launcher's variable set, and the rank environment contract."""

from __future__ import annotations

import pytest

from hpcring.contracts.rank_env import NAMES, RANK_VARIABLES, rank_environment
from hpcring.errors import ConfigError
from hpcring.launch.detection import Detected, check_launcher, detect

# What each launcher really exports to one rank (rank 5 of 8, second of 4 on node 1 of 2).
SRUN = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
}
JSRUN = {
    "JSM_NAMESPACE_RANK": "5",
    "JSM_NAMESPACE_SIZE": "8",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
    "JSM_NAMESPACE_LOCAL_SIZE": "4",
    "LSB_MCPU_HOSTS": "batch1 1 node1 42 node2 42",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "PMIX_RANK": "5",
}
HYDRA = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4", "PMI_FD": "9"}


def test_srun() -> None:
    assert detect(SRUN) == Detected("srun", rank=5, size=8, local_rank=1, local_size=4, node=1, num_nodes=2)


def test_srun_with_pmi2_is_still_srun() -> None:
    """srun --mpi=pmi2 also sets PMI_RANK; it agrees with SLURM_PROCID, so Slurm's richer view wins."""
    found = detect({**SRUN, **HYDRA})
    assert found.launcher == "srun" and found.node == 1


def test_mpirun_inside_an_allocation_is_mpirun() -> None:
    """Ranks of mpirun in sbatch inherit the daemon step's SLURM_PROCID (node index): it must not win."""
    env = {**SRUN, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", **OPENMPI}
    assert detect(env) == Detected("mpirun", rank=5, size=8, local_rank=1, local_size=4)


def test_jsrun() -> None:
    assert detect(JSRUN) == Detected("jsrun", rank=5, size=8, local_rank=1, local_size=4, num_nodes=2)


def test_openmpi_mpirun() -> None:
    assert detect(OPENMPI) == Detected("mpirun", rank=5, size=8, local_rank=1, local_size=4)


def test_hydra_mpiexec() -> None:
    assert detect(HYDRA) == Detected("mpirun", rank=5, size=8, local_rank=1, local_size=4)


def test_hpcring_wins_over_the_mpi_it_runs_under() -> None:
    env = {
        **OPENMPI,
        **rank_environment(
            rank=5,
            size=8,
            local_rank=1,
            local_size=4,
            cross_rank=1,
            cross_size=2,
            hostname="n2",
            master_addr="n1",
            master_port=29500,
        ),
    }
    assert detect(env) == Detected("hpcring", rank=5, size=8, local_rank=1, local_size=4, node=1, num_nodes=2)


def test_nothing() -> None:
    found = detect({"HOME": "/root", "SLURM_JOB_ID": "3"})
    assert found == Detected("none") and not found.launched


def test_malformed_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match="SLURM_PROCID='x' is not an integer"):
        detect({"SLURM_PROCID": "x"})


def test_rank_environment_contract() -> None:
    """Every name of the table gets its value: ours, torchrun's and Horovod's for the same place."""
    env = rank_environment(
        rank=3,
        size=4,
        local_rank=1,
        local_size=2,
        cross_rank=1,
        cross_size=2,
        hostname="node2",
        master_addr="node1",
        master_port=29500,
    )
    assert set(env) == set(RANK_VARIABLES) == {n for names in NAMES.values() for n in names}
    assert env["RANK"] == env["HPCRING_RANK"] == env["HOROVOD_RANK"] == "3"
    assert env["WORLD_SIZE"] == env["HPCRING_SIZE"] == env["HOROVOD_SIZE"] == "4"
    assert env["LOCAL_RANK"] == env["HPCRING_LOCAL_RANK"] == env["HOROVOD_LOCAL_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == env["HPCRING_LOCAL_SIZE"] == env["HOROVOD_LOCAL_SIZE"] == "2"
    assert env["HPCRING_CROSS_RANK"] == env["HOROVOD_CROSS_RANK"] == "1"
    assert env["HPCRING_CROSS_SIZE"] == env["HOROVOD_CROSS_SIZE"] == "2"
    assert env["HOROVOD_HOSTNAME"] == "node2"
    assert env["MASTER_ADDR"] == "node1" and env["MASTER_PORT"] == "29500"
    # horovodrun's slot variables (horovod/runner/gloo_run.py, create_slot_env_vars), all of them.
    horovod = {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME"}
    assert {n for n in env if n.startswith("HOROVOD_")} == {f"HOROVOD_{n}" for n in horovod}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 4}, "rank 4 is outside 0..3"),
        ({"local_rank": 2}, "local rank 2 / local size 2 invalid"),
        ({"cross_size": 5}, "cross rank 1 / cross size 5 invalid"),
        ({"master_port": 0}, "not a TCP port"),
        ({"hostname": ""}, "empty host name"),
    ],
)
def test_rank_environment_rejects_inconsistent_values(kwargs: dict[str, object], message: str) -> None:
    base = {
        "rank": 3,
        "size": 4,
        "local_rank": 1,
        "local_size": 2,
        "cross_rank": 1,
        "cross_size": 2,
        "master_port": 29500,
        "hostname": "n2",
    }
    with pytest.raises(ConfigError, match=message):
        rank_environment(**{**base, **kwargs}, master_addr="n1")  # type: ignore[arg-type]


def test_check_launcher() -> None:
    assert check_launcher("jsrun") == "jsrun"
    with pytest.raises(ConfigError, match="allowed: 'hpcring', 'srun', 'jsrun', 'mpirun' or 'none'"):
        check_launcher("aprun")
