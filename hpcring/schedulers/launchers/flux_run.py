"""`flux run`: Flux's launcher. Flux places tasks itself inside the allocation: `-N -n -c -g` give the task
geometry and `-o cpu-affinity=per-task` / `-o gpu-affinity=per-task` bind each task to the cores and GPUs
Flux assigned it (CUDA_VISIBLE_DEVICES); `--exclusive` takes whole nodes.

`cpu_affinity: map` / `gpu_affinity: map` in `site.flux` bind each rank to the RankMap's own CPUs and GPUs
instead (`-o cpu-affinity=map:0-7;8-15;...`, as flux-shell documents it), on exclusive nodes only.
Flux counts cores, not hardware threads: `-c` is the rank's physical cores.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from hpcring.schedulers import cpuset
from hpcring.schedulers.interfaces import Launcher
from hpcring.schedulers.mapping import RankMap


def resources(rm: RankMap) -> list[str]:
    """Task geometry shared by `# flux:` directives and `flux run`: nodes, tasks, cores and GPUs per task."""
    s = rm.shape
    out = [f"-N {s.nodes}", f"-n {s.ranks}", f"-c {s.cpus_per_rank}"]
    if s.gpus_per_rank:
        out.append(f"-g {s.gpus_per_rank}")
    return out


def cpu_map(rm: RankMap) -> str:
    """`map:` value of the mapping's CPUs per local task (OS numbers, hwloc list form, `;` between tasks)."""
    return "map:" + ";".join(cpuset.format_list(s.cpus) for s in rm.slots(0))


def gpu_map(rm: RankMap) -> str:
    """`map:` value of the mapping's GPUs per local task."""
    return "map:" + ";".join(",".join(map(str, s.gpus)) for s in rm.slots(0))


def affinity(rm: RankMap) -> list[str]:
    """`-o cpu-affinity=` / `-o gpu-affinity=`: the site's choice (`map`: the RankMap's own devices), `off`
    when the site launches unbound or when every rank must see all of the node's GPUs (shared visibility)."""
    site, shape = rm.profile.site, rm.shape
    cpu = site.flux.cpu_affinity if site.binding else "off"
    out = ["-o", f"cpu-affinity={cpu_map(rm) if cpu == 'map' else cpu}"]
    if shape.gpus_per_rank:
        gpu = "off" if rm.profile.node.gpu_visibility == "shared" else site.flux.gpu_affinity
        out += ["-o", f"gpu-affinity={gpu_map(rm) if gpu == 'map' else gpu}"]
    return out


def flags(rm: RankMap) -> list[str]:
    words = [w for r in resources(rm) for w in r.split(" ")]
    if rm.profile.site.flux.exclusive:
        words.append("--exclusive")
    return [*words, *affinity(rm)]


class FluxRun(Launcher):
    name = "flux"

    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        return ["flux", "run", *flags(rm), *command]

    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        """Quoted as a shell would need it: a `map:` value holds `;` between tasks."""
        return shlex.join(["flux", "run", *flags(rm)]) + "\n"
