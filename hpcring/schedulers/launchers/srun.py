"""srun: Slurm's launcher. Binding comes from the mapping as per-local-task lists (`map_cpu`/`mask_cpu`,
`map_gpu`/`mask_gpu`), `--gpu-bind=closest` where the site documents it (Frontier), or, with `gpu_bind:
wrapper` (LUMI-G), every GPU of the node requested per node and each rank started through the per-rank
wrapper that sets the vendor's visibility variable from SLURM_LOCALID, as LUMI's `select_gpu` does."""

from __future__ import annotations

from collections.abc import Sequence

from hpcring.schedulers import cpuset
from hpcring.schedulers.interfaces import Launcher
from hpcring.schedulers.launchers import mpiexec_affinity
from hpcring.schedulers.mapping import RankMap

AFFINITY = mpiexec_affinity.SUFFIX  # the wrapper file's suffix (its variable: HPCRING_AFFINITY)


def cpu_bind(rm: RankMap) -> str:
    """`--cpu-bind=` value: map_cpu when every rank has one CPU, else mask_cpu (Slurm 22.05 syntax)."""
    if not rm.profile.site.binding:
        return "none"
    slots = rm.slots(0)
    if all(len(s.cpus) == 1 for s in slots):
        return "map_cpu:" + ",".join(str(s.cpus[0]) for s in slots)
    return "mask_cpu:" + ",".join(cpuset.mask(s.cpus) for s in slots)


def gpu_flags(rm: RankMap) -> list[str]:
    """GPU request and binding: per task when isolated; the whole set, unbound, when shared."""
    shape, node, site = rm.shape, rm.profile.node, rm.profile.site
    if shape.gpus_per_rank == 0:
        return []
    if node.gpu_visibility == "shared":
        return [f"--gpus-per-node={shape.gpus_per_rank * shape.max_ranks_per_node}", "--gpu-bind=none"]
    if uses_wrapper(rm):
        # No Slurm GPU binding: every GPU stays in each task's cgroup; the wrapper picks the rank's own.
        return [f"--gpus-per-node={shape.gpus_per_rank * shape.max_ranks_per_node}"]
    flags = [f"--gpus-per-task={shape.gpus_per_rank}"]
    style = site.slurm.gpu_bind
    if style == "closest":
        flags.append("--gpu-bind=closest")
    elif style == "none":
        flags.append("--gpu-bind=none")
    elif shape.gpus_per_rank == 1:
        flags.append("--gpu-bind=map_gpu:" + ",".join(str(s.gpu_sched[0]) for s in rm.slots(0)))
    else:
        flags.append("--gpu-bind=mask_gpu:" + ",".join(cpuset.mask(s.gpu_sched) for s in rm.slots(0)))
    return flags


def uses_wrapper(rm: RankMap) -> bool:
    """Ranks start through the per-rank GPU wrapper (`gpu_bind: wrapper`, GPUs in use, isolated)."""
    return rm.profile.site.slurm.gpu_bind == "wrapper" and mpiexec_affinity.needed(rm)


def wrapper_script(rm: RankMap) -> str:
    """The per-rank wrapper under srun: the local rank from SLURM_LOCALID, as LUMI's select_gpu reads it."""
    return mpiexec_affinity.script(rm, mpiexec_affinity.SLURM_LOCAL_RANK_VARS, "srun")


def task_flags(rm: RankMap) -> list[str]:
    """Task geometry shared by `#SBATCH` and srun: nodes, tasks, CPUs (hardware threads) per task."""
    shape, node = rm.shape, rm.profile.node
    flags = [f"--nodes={shape.nodes}", f"--ntasks={shape.ranks}"]
    if shape.even:
        flags.append(f"--ntasks-per-node={shape.max_ranks_per_node}")
    flags.append(f"--cpus-per-task={shape.cpus_per_rank * shape.threads_per_core}")
    if node.threads_per_core > 1:
        flags.append(f"--threads-per-core={shape.threads_per_core}")
    return flags


class Srun(Launcher):
    name = "srun"
    node_files = frozenset({AFFINITY})

    def files(self, rm: RankMap) -> dict[str, str]:
        return {AFFINITY: wrapper_script(rm)} if uses_wrapper(rm) else {}

    def flags(self, rm: RankMap) -> list[str]:
        """Every srun flag for this mapping (the rank command follows them)."""
        site = rm.profile.site
        flags = [*task_flags(rm), f"--cpu-bind={cpu_bind(rm)}", *gpu_flags(rm), "--kill-on-bad-exit=1"]
        if site.slurm.mpi:
            flags.append(f"--mpi={site.slurm.mpi}")
        return flags

    def argv(self, rm: RankMap, command: Sequence[str], paths: dict[str, str]) -> list[str]:
        wrapper = ["bash", paths[AFFINITY]] if AFFINITY in paths else []
        return ["srun", *self.flags(rm), *wrapper, *command]

    def map_text(self, rm: RankMap, paths: dict[str, str]) -> str:
        text = " ".join(["srun", *self.flags(rm)]) + "\n"
        return text + wrapper_script(rm) if uses_wrapper(rm) else text
