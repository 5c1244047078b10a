"""jsrun (IBM Job Step Manager, Summit): an Explicit Resource File (ERF) with one line per rank, or plain
resource sets when binding is off.

ERF lines use physical hardware-thread numbers (`cpu_index_using: physical`), exactly the OS numbers of the
mapping; with a launch node (Summit) compute hosts are numbered from 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcring.schedulers import cpuset
from hpcring.schedulers.interfaces import Launcher
from hpcring.schedulers.mapping import RankMap, Slot


def _braces(values: Sequence[int]) -> str:
    return ",".join("{" + (f"{a}" if a == b else f"{a}-{b}") + "}" for a, b in cpuset.ranges(values))


def _slot_spec(slot: Slot) -> str:
    spec = f"cpu: {_braces(slot.cpus)}"
    if slot.gpu_sched:
        spec += f" ; gpu: {_braces(slot.gpu_sched)}"
    return spec


def erf(rm: RankMap) -> str:
    """The ERF text for the whole job (one line per rank)."""
    first_host = 1 if rm.profile.site.lsf.launch_node else 0
    lines = ["cpu_index_using: physical"]
    specs = [[_slot_spec(s) for s in layout] for layout in rm.layouts]
    rank = 0
    for node in range(rm.shape.nodes):
        layout = specs[0] if rm.shape.even or node < rm.shape.extra_nodes else specs[1]
        host = node + first_host
        for spec in layout:
            lines.append(f"rank: {rank}: {{ host: {host}; {spec} }}")
            rank += 1
    return "\n".join(lines) + "\n"


class Jsrun(Launcher):
    name = "jsrun"

    def files(self, rm: RankMap) -> dict[str, str]:
        return {"erf": erf(rm)} if rm.profile.site.binding else {}

    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        if "erf" in paths:
            return ["jsrun", "--erf_input", paths["erf"], *command]
        s = rm.shape
        return [
            "jsrun",
            f"--nrs={s.ranks}",
            "--tasks_per_rs=1",
            f"--cpu_per_rs={s.cpus_per_rank}",
            f"--gpu_per_rs={s.gpus_per_rank}",
            f"--rs_per_host={s.max_ranks_per_node}",
            "--bind=none",
            *command,
        ]

    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        return erf(rm)
