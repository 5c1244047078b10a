"""mpiexec as PBS sites run it: Cray PALS (`mpiexec -n N --ppn P --depth D --cpu-bind list:...`, Polaris and
Aurora) or MPICH hydra (`mpiexec -n N -ppn P -bind-to user:...`), with the per-rank GPU wrapper in front of
the command when ranks must each see only their own GPUs.

Both take per-local-rank CPU lists in OS numbering, exactly the mapping's: PALS separates ranks with `:` and
CPUs with `,` (ranges allowed); hydra separates ranks with `,` and CPUs with `+`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcring.schedulers import cpuset, site_options
from hpcring.schedulers.interfaces import Launcher
from hpcring.schedulers.launchers import mpiexec_affinity
from hpcring.schedulers.mapping import RankMap

AFFINITY = mpiexec_affinity.SUFFIX  # suffix of the wrapper file (and of its variable, HPCRING_AFFINITY)


def flavour(rm: RankMap) -> str:
    site = rm.profile.site
    return site_options.mpiexec_flavour(site.pbs, site.mpi)


def pals_cpu_bind(rm: RankMap) -> str:
    """`--cpu-bind` value: `list:0-6:7-13` per local rank, or `none` when the site launches unbound."""
    if not rm.profile.site.binding:
        return "none"
    return "list:" + ":".join(cpuset.format_list(s.cpus) for s in rm.slots(0))


def hydra_bind(rm: RankMap) -> str:
    """`-bind-to` value: `user:0+1,2+3` per local rank, or `none`."""
    if not rm.profile.site.binding:
        return "none"
    return "user:" + ",".join("+".join(map(str, s.cpus)) for s in rm.slots(0))


def flags(rm: RankMap) -> list[str]:
    """Every mpiexec flag for this mapping (the wrapper and the rank command follow them)."""
    s = rm.shape
    if flavour(rm) == "pals":
        depth = s.cpus_per_rank * s.threads_per_core
        return [
            "-n",
            str(s.ranks),
            "--ppn",
            str(s.max_ranks_per_node),
            "--depth",
            str(depth),
            "--cpu-bind",
            pals_cpu_bind(rm),
        ]
    return ["-n", str(s.ranks), "-ppn", str(s.max_ranks_per_node), "-bind-to", hydra_bind(rm)]


class Mpiexec(Launcher):
    name = "mpiexec"
    node_files = frozenset({AFFINITY})

    def files(self, rm: RankMap) -> dict[str, str]:
        return {AFFINITY: mpiexec_affinity.script(rm)} if mpiexec_affinity.needed(rm) else {}

    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        wrapper = ["bash", paths[AFFINITY]] if AFFINITY in paths else []
        return ["mpiexec", *flags(rm), *wrapper, *command]

    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        text = " ".join(["mpiexec", *flags(rm)]) + "\n"
        if mpiexec_affinity.needed(rm):
            text += mpiexec_affinity.script(rm)
        return text
