"""mpirun inside an allocation: Open MPI with a rankfile, MPICH (Hydra) with per-rank CPU lists.

Open MPI's rankfile takes *logical* hardware-thread indexes with the `HWTCPUS` qualifier (hwloc order: core by
core, threads within a core), so OS numbers from the mapping are translated; hosts are relative (`+n0`) to the
allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcring.schedulers import cpuset
from hpcring.schedulers.interfaces import Launcher
from hpcring.schedulers.mapping import RankMap
from hpcring.schedulers.model import Node
from hpcring.schedulers.shell import Raw


def logical_pus(node: Node, cores: Sequence[int], threads: int) -> list[int]:
    """hwloc logical PU indexes of the first `threads` threads of each core."""
    return [c * node.threads_per_core + t for c in cores for t in range(threads)]


def rankfile(rm: RankMap) -> str:
    """Open MPI rankfile for the whole job."""
    node, shape = rm.profile.node, rm.shape
    slots = [
        [cpuset.format_list(logical_pus(node, s.cores, shape.threads_per_core)) for s in layout]
        for layout in rm.layouts
    ]
    lines = []
    rank = 0
    for n in range(shape.nodes):
        for pus in slots[0] if shape.even or n < shape.extra_nodes else slots[1]:
            lines.append(f"rank {rank}=+n{n} slot={pus}")
            rank += 1
    return "\n".join(lines) + "\n"


def _openmpi(rm: RankMap) -> bool:
    return rm.profile.site.mpi not in ("mpich", "cray-mpich", "intel-mpi")


class Mpirun(Launcher):
    name = "mpirun"

    def files(self, rm: RankMap) -> dict[str, str]:
        return {"rankfile": rankfile(rm)} if rm.profile.site.binding and _openmpi(rm) else {}

    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        s = rm.shape
        if _openmpi(rm):
            if "rankfile" in paths:
                rf = paths["rankfile"]
                spec = f"rankfile:FILE={rf}:HWTCPUS"
                return [
                    "mpirun",
                    "-n",
                    str(s.ranks),
                    "--map-by",
                    Raw(spec) if isinstance(rf, Raw) else spec,
                    *command,
                ]
            ppr = f"ppr:{s.max_ranks_per_node}:node"
            return ["mpirun", "-n", str(s.ranks), "--map-by", ppr, "--bind-to", "none", *command]
        argv = ["mpiexec", "-n", str(s.ranks), "-ppn", str(s.max_ranks_per_node)]
        if rm.profile.site.binding:
            lists = ["+".join(map(str, slot.cpus)) for slot in rm.slots(0)]
            argv += ["-bind-to", "user:" + ",".join(lists)]
        else:
            argv += ["-bind-to", "none"]
        return [*argv, *command]

    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        return rankfile(rm)
