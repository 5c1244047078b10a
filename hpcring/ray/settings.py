"""Settings of a Ray job (Horovod's `RayExecutor.create_settings` / `MiniSettings`), checked on creation."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hpcring.errors import ConfigError


@dataclass
class MiniSettings:
    """What the executors read: start timeout, placement-group timeout, and Horovod's other fields.

    `timeout_s` bounds forming the world (Horovod's Gloo rendezvous timeout; here the MPI port rendezvous);
    `nics` and `ssh_identity_file` are kept for compatibility: workers never ssh, and MPICH picks its own
    interface (set `MPIR_CVAR_CH4_*`/`FI_*`/`UCX_*` through `extra_env_vars` to choose one).
    """

    timeout_s: float = 30
    ssh_identity_file: str | None = None
    placement_group_timeout_s: float = 100
    nics: set[str] | None = None
    elastic: bool = False
    verbose: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_group_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


def create_settings(
    timeout_s: float = 30,
    ssh_identity_file: str | None = None,
    ssh_str: str | None = None,
    placement_group_timeout_s: float = 100,
    nics: set[str] | None = None,
) -> MiniSettings:
    """Horovod's `RayExecutor.create_settings`; `ssh_str` is written to `ssh_identity_file` (mode 0600) as
    Horovod does, though hpcring's workers never use ssh."""
    if ssh_str:
        if not ssh_identity_file:
            raise ConfigError("ssh_str needs ssh_identity_file: the path to write the key to")
        if not os.path.exists(ssh_identity_file):
            fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(ssh_str)
    return MiniSettings(
        timeout_s=timeout_s,
        ssh_identity_file=ssh_identity_file,
        placement_group_timeout_s=placement_group_timeout_s,
        nics=nics,
    )
