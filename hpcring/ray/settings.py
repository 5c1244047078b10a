"""Settings of a Ray job, checked on creation: Horovod's `RayExecutor.create_settings` (`MiniSettings`) and
`ElasticRayExecutor.create_settings` (`ElasticSettings`)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from hpcring.contracts import horovod_alias
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
    # hpcring's: `import horovod` in the workers resolves to hpcring (HPCRING_HOROVOD=1, horovod_alias)
    horovod: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.horovod, bool):
            raise ConfigError(f"horovod must be True or False, got {self.horovod!r}")
        if self.horovod:
            horovod_alias.refuse_if_real_horovod("horovod=True was given")
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
    horovod: bool = False,
) -> MiniSettings:
    """Horovod's `RayExecutor.create_settings`; `ssh_str` is written to `ssh_identity_file` (mode 0600) as
    Horovod does, though hpcring's workers never use ssh. `horovod=True` (hpcring's) lets the workers run
    Horovod code unchanged: `import horovod` resolves to hpcring there."""
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
        horovod=horovod,
    )


@dataclass
class ElasticSettings(MiniSettings):
    """Horovod's ElasticSettings fields that the Ray executor reads."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.min_num_proc, int) or self.min_num_proc < 1:
            raise ConfigError(f"min_num_proc must be a positive integer, got {self.min_num_proc!r}")
        if self.max_num_proc is not None and (
            not isinstance(self.max_num_proc, int) or self.max_num_proc < self.min_num_proc
        ):
            raise ConfigError(
                f"max_num_proc must be an integer >= min_num_proc ({self.min_num_proc}), "
                f"got {self.max_num_proc!r}"
            )
        if self.reset_limit is not None and (not isinstance(self.reset_limit, int) or self.reset_limit < 0):
            raise ConfigError(f"reset_limit must be an integer >= 0 or None, got {self.reset_limit!r}")
        if self.elastic_timeout <= 0:
            raise ConfigError(
                f"elastic_timeout must be a positive number of seconds, got {self.elastic_timeout!r}"
            )

    @property
    def num_proc(self) -> int:
        return self.min_num_proc


def horovod_env(settings: MiniSettings) -> dict[str, str]:
    """The workers' variable for `settings.horovod` (the worker installs the alias when it sees it)."""
    return {horovod_alias.ENV_VARIABLE: "1"} if settings.horovod else {}


def create_elastic_settings(
    min_num_proc: int = 1,
    max_num_proc: int | None = None,
    reset_limit: int | None = None,
    elastic_timeout: float = 600,
    timeout_s: float = 30,
    ssh_identity_file: str | None = None,
    nics: set[str] | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    horovod: bool = False,
    **kwargs: Any,
) -> ElasticSettings:
    """Horovod's `ElasticRayExecutor.create_settings` (min_np/max_np are its deprecated spellings)."""
    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
        max_num_proc = max_np
    return ElasticSettings(
        timeout_s=timeout_s,
        ssh_identity_file=ssh_identity_file,
        nics=nics,
        min_num_proc=min_num_proc,
        max_num_proc=max_num_proc,
        reset_limit=reset_limit,
        elastic_timeout=elastic_timeout,
        horovod=horovod,
        verbose=int(kwargs.pop("verbose", 0) or 0),
        extra=kwargs,
    )
