"""The rank environment: the variables every rank gets, whatever started it.

`hpcring run` gives every rank these variables, and `hpcring.init()` sets the same ones (without overriding)
in a job started by srun, jsrun or a plain mpirun, so user code (and torch's `env://` rendezvous) can read
RANK/LOCAL_RANK/... either way. A contract between the launcher and the ranks: it imports neither.
"""

from __future__ import annotations

from hpcring.errors import ConfigError

# Variables every rank gets; the HPCRING_* names are ours, the rest are what torchrun sets.
RANK_VARIABLES = (
    "HPCRING_RANK",
    "HPCRING_SIZE",
    "HPCRING_LOCAL_RANK",
    "HPCRING_LOCAL_SIZE",
    "HPCRING_CROSS_RANK",
    "HPCRING_CROSS_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def rank_environment(
    *,
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    cross_rank: int,
    cross_size: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The variables one rank gets, as strings; checks the values are consistent so a bug shows here."""
    if not 0 <= rank < size:
        raise ConfigError(f"rank {rank} is outside 0..{size - 1} (world size {size})")
    if not 0 <= local_rank < local_size <= size:
        raise ConfigError(f"local rank {local_rank} / local size {local_size} invalid for world size {size}")
    if not 0 <= cross_rank < cross_size <= size:
        raise ConfigError(f"cross rank {cross_rank} / cross size {cross_size} invalid for world size {size}")
    if not 0 < master_port < 65536:
        raise ConfigError(f"master port {master_port} is not a TCP port (1..65535)")
    return {
        "HPCRING_RANK": str(rank),
        "HPCRING_SIZE": str(size),
        "HPCRING_LOCAL_RANK": str(local_rank),
        "HPCRING_LOCAL_SIZE": str(local_size),
        "HPCRING_CROSS_RANK": str(cross_rank),
        "HPCRING_CROSS_SIZE": str(cross_size),
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
