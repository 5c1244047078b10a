"""Container wrapping, hybrid-MPI style: the launcher starts the runtime, which starts the rank command.

`srun ... apptainer exec --rocm --bind /lustre image.sif python train.py`: MPI is started by the host's
launcher
and the MPI inside the image talks to it, which is how OLCF and most sites document Apptainer/Singularity
jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcring.errors import ConfigError, choices
from hpcring.schedulers.model import RUNTIMES, Profile


@dataclass(frozen=True)
class ContainerPlan:
    """The runtime, image and the argv prefix that goes before every rank command."""

    runtime: str
    image: str
    prefix: tuple[str, ...]


def plan(profile: Profile, image: str | None, binds: Sequence[str], uses_gpus: bool) -> ContainerPlan | None:
    """The container plan for a job, or None when it runs on the host."""
    if image is None:
        return None
    c = profile.site.container
    if c is None:
        raise ConfigError(
            f"--image given, but profile {profile.name!r} has no container runtime; set "
            f"site.container.runtime to {choices(RUNTIMES)}"
        )
    argv: list[str] = [c.runtime, "exec"]
    if uses_gpus:
        argv.append("--rocm" if profile.node.gpu_vendor == "amd" else "--nv")
    for b in (*c.binds, *binds):
        argv += ["--bind", b]
    argv += [*c.extra_args, image]
    return ContainerPlan(c.runtime, image, tuple(argv))
