"""The rank environment: the variables every rank gets, whatever started it.

`hpcring run` gives every rank these variables, and `hpcring.init()` sets the same ones (without overriding)
in a job started by srun, jsrun or a plain mpirun, so user code (and torch's `env://` rendezvous) can read
RANK/LOCAL_RANK/... either way. A contract between the launcher and the ranks: it imports neither.
"""

from __future__ import annotations

from hpcring.errors import ConfigError

# The one table: each value a rank gets and every name it is exported under. HPCRING_* are ours, RANK ...
# MASTER_PORT are what torchrun sets, HOROVOD_* are what horovodrun gives its workers (horovod/runner/
# gloo_run.py's slot variables, read by Horovod's own Gloo context and by its elastic test scripts).
NAMES: dict[str, tuple[str, ...]] = {
    "rank": ("HPCRING_RANK", "RANK", "HOROVOD_RANK"),
    "size": ("HPCRING_SIZE", "WORLD_SIZE", "HOROVOD_SIZE"),
    "local_rank": ("HPCRING_LOCAL_RANK", "LOCAL_RANK", "HOROVOD_LOCAL_RANK"),
    "local_size": ("HPCRING_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE"),
    "cross_rank": ("HPCRING_CROSS_RANK", "HOROVOD_CROSS_RANK"),
    "cross_size": ("HPCRING_CROSS_SIZE", "HOROVOD_CROSS_SIZE"),
    "hostname": ("HOROVOD_HOSTNAME",),
    "master_addr": ("MASTER_ADDR",),
    "master_port": ("MASTER_PORT",),
}

# Every variable a rank gets from the table (a launcher never forwards its own copies to remote ranks).
RANK_VARIABLES = tuple(name for names in NAMES.values() for name in names)


def rank_environment(
    *,
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    cross_rank: int,
    cross_size: int,
    hostname: str,
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
    if not hostname:
        raise ConfigError(f"rank {rank} has an empty host name")
    values: dict[str, object] = {
        "rank": rank,
        "size": size,
        "local_rank": local_rank,
        "local_size": local_size,
        "cross_rank": cross_rank,
        "cross_size": cross_size,
        "hostname": hostname,
        "master_addr": master_addr,
        "master_port": master_port,
    }
    return {name: str(values[key]) for key, names in NAMES.items() for name in names}
