"""Facts from every source -> the profile's content, with what is unknown kept as TODO notes.

Precedence: /sys for the CPUs (hwloc where /sys has no topology, and as a cross-check), the vendor tool for
GPUs, /sys for NICs (with nvidia-smi's PCIe attachments), and the first batch system that answers, in the
order Slurm, PBS, Flux, LSF.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hpcring.errors import ProfileError, choices
from hpcring.schedulers import cpuset, walltime
from hpcring.schedulers.profile_init import (
    flux_facts,
    hwloc,
    lsf_facts,
    nvidia,
    pbs_facts,
    rocm,
    slurm_facts,
    sysfs,
)
from hpcring.schedulers.profile_init.facts import BatchFacts, CpuFacts, GpuFact, NicFact, QueueFact
from hpcring.schedulers.profile_init.probe import Outputs

LAUNCHER = {"slurm": "srun", "pbs": "mpiexec", "flux": "flux", "lsf": "mpirun"}
SELECTOR = {"slurm": "partition", "pbs": "queue", "lsf": "queue"}


@dataclass
class Draft:
    """The profile's sections, each with TODO lines the writer puts next to it as comments."""

    name: str
    sources: list[str]
    node: dict[str, Any]
    site: dict[str, Any]
    todo_node: list[str] = field(default_factory=list)
    todo_site: list[str] = field(default_factory=list)
    todo_partitions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def clean_name(text: str) -> str:
    """A valid profile name from a host or cluster name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip()).strip("-._")
    return name or "my-cluster"


def cpu_facts(files: sysfs.Files, out: Outputs, notes: list[str], sources: list[str]) -> CpuFacts:
    from_sys = sysfs.cpus(files)
    from_hwloc = hwloc.cpus(out["lstopo"]) if "lstopo" in out else None
    if from_sys is not None:
        sources.append("/sys (CPUs, NUMA)")
    if from_hwloc is not None:
        sources.append("lstopo --of xml")
        if from_sys is not None and hwloc.describe(from_sys) != hwloc.describe(from_hwloc):
            mine, theirs = hwloc.describe(from_sys), hwloc.describe(from_hwloc)
            notes.append(f"/sys and hwloc disagree: /sys {mine}; hwloc {theirs}")
    facts = from_sys or from_hwloc
    if facts is None:
        raise ProfileError(
            "profiles init: no CPU topology found: /sys/devices/system/cpu has no topology files and lstopo "
            "is not installed; run on a compute node, or give --sysfs-root / --from-dir with lstopo.txt"
        )
    return facts


def node_section(
    facts: CpuFacts,
    gpus: list[GpuFact],
    vendor: str | None,
    nics: list[NicFact],
    interconnect: str | None,
    draft: Draft,
) -> None:
    ncores = facts.sockets * facts.cores_per_socket
    node: dict[str, Any] = {
        "sockets": facts.sockets,
        "cores_per_socket": facts.cores_per_socket,
        "threads_per_core": facts.threads_per_core,
        "thread_numbering": facts.thread_numbering,
        "reserved_cores": [],
    }
    draft.todo_node.append(
        "reserved_cores: cores the site keeps for the system (core specialisation, low-noise mode) are not "
        "visible from a node; list them if your site documents any"
    )
    covered = sorted(c for _, cores in facts.numa for c in cores)
    if facts.numa and covered == list(range(ncores)):
        node["numa"] = [{"id": i, "cores": cpuset.format_list(c)} for i, c in facts.numa]
    elif facts.numa:
        draft.notes.append("NUMA domains in /sys do not cover every core once; left at one domain per socket")
    domain_ids = [i for i, _ in facts.numa] if "numa" in node else list(range(facts.sockets))
    if vendor:
        node["gpu_vendor"] = vendor
    domain_cores = {i: set(c) for i, c in facts.numa} if "numa" in node else {}
    node["gpus"] = [_closest(_gpu(g, domain_ids, draft), g, facts, domain_cores) for g in gpus]
    node["nics"] = [_nic(n, domain_ids) for n in nics]
    node["interconnect"] = interconnect or "ethernet"
    if interconnect is None:
        draft.todo_node.append(
            "interconnect: /sys shows no InfiniBand or RoCE device; set slingshot on HPE Slingshot systems "
            "(its NICs are named hsn0, hsn1, ...)"
        )
    draft.node = node


def _gpu(g: GpuFact, domains: list[int], draft: Draft) -> dict[str, Any]:
    if g.numa in domains:
        return {"index": g.index, "numa": g.numa}
    draft.todo_node.append(f"gpus: GPU {g.index} reports no NUMA node; numa {domains[0]} is a placeholder")
    return {"index": g.index, "numa": domains[0]}


def _closest(
    entry: dict[str, Any], g: GpuFact, facts: CpuFacts, domain_cores: dict[int, set[int]]
) -> dict[str, Any]:
    """closest_cores from the vendor tool's CPU affinity, where it is narrower than the GPU's NUMA domain."""
    ncores = facts.sockets * facts.cores_per_socket
    compact = facts.thread_numbering == "compact"
    cores = {c // facts.threads_per_core if compact else c % ncores for c in g.cpus}
    domain = domain_cores.get(entry["numa"], set())
    if cores and cores < domain:
        entry["closest_cores"] = cpuset.format_list(sorted(cores))
    return entry


def _nic(n: NicFact, domains: list[int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": n.name}
    if n.numa in domains:
        entry["numa"] = n.numa
    if n.gpus:
        entry["gpus"] = list(n.gpus)
    return entry


def gpu_facts(out: Outputs, sources: list[str]) -> tuple[list[GpuFact], list[NicFact], str | None]:
    if "nvidia-smi-topo" in out:
        gpus, attached = nvidia.parse(out["nvidia-smi-topo"])
        if gpus:
            sources.append("nvidia-smi topo -m")
            return gpus, attached, "nvidia"
    if "rocm-smi-toponuma" in out:
        gpus = rocm.parse(out["rocm-smi-toponuma"])
        if gpus:
            sources.append("rocm-smi --showtoponuma")
            return gpus, [], "amd"
    return [], [], None


def merge_nics(from_sys: list[NicFact], attached: list[NicFact]) -> list[NicFact]:
    """/sys's NICs, with the GPUs nvidia-smi says each one shares a PCIe path with."""
    by_name = {n.name: n.gpus for n in attached}
    return [NicFact(n.name, n.numa, by_name.get(n.name, ())) for n in from_sys]


def batch_facts(out: Outputs, sources: list[str]) -> BatchFacts | None:
    if "scontrol-config" in out or "scontrol-partition" in out or "sinfo" in out:
        conf = slurm_facts.config(out.get("scontrol-config", ""))
        partitions = slurm_facts.partitions(out.get("scontrol-partition", ""))
        queues = partitions or slurm_facts.sinfo(out.get("sinfo", ""))
        sources.append("Slurm (scontrol show config/partition, sinfo)")
        notes = (f"Slurm ClusterName={conf['ClusterName']}",) if "ClusterName" in conf else ()
        return BatchFacts("slurm", tuple(queues), slurm_facts.mpi_default(conf), notes)
    if "qstat-queues" in out and pbs_facts.is_pbs(out["qstat-queues"]):
        sources.append("PBS (qstat -Qf, qstat -Bf)")
        default = pbs_facts.default_queue(out.get("qstat-server", ""))
        return BatchFacts("pbs", tuple(pbs_facts.queues(out["qstat-queues"], default)))
    if "flux-resource" in out:
        res = flux_facts.resources(out["flux-resource"])
        if res is not None:
            sources.append("Flux (flux resource list)")
            note = (
                f"flux resource list: {res.nodes} nodes, {res.cores} cores, {res.gpus} GPUs in this instance"
            )
            return BatchFacts("flux", (), None, (note,))
    if "bqueues" in out:
        names = lsf_facts.queue_names(out["bqueues"])
        if names:
            sources.append("LSF (bqueues)")
            return BatchFacts("lsf", tuple(QueueFact(n, None, None) for n in names))
    return None


# What `batch_facts` looks for, by scheduler: named when none answers.
LOOKED_FOR = {
    "slurm": "scontrol/sinfo (Slurm)",
    "pbs": "qstat (PBS)",
    "flux": "flux resource list (Flux)",
    "lsf": "bqueues (LSF)",
}


def chosen_batch(found: BatchFacts | None, asked: str | None, draft: Draft) -> BatchFacts:
    """The batch system the profile names: the one asked for (`--scheduler`), else the one found.

    With neither, a guess would write `srun` jobs for a cluster that may run PBS, so init refuses, naming what
    it looked for and the schedulers allowed. Asked for one other than the one found, the asked one wins and
    the found one's queues are left out (they belong to the other system).
    """
    if asked is not None and asked not in LAUNCHER:
        raise ProfileError(f"--scheduler: {asked!r} is not allowed; allowed: {choices(list(LAUNCHER))}")
    if asked is None:
        if found is None:
            raise ProfileError(
                "profiles init: no batch system answered (looked for "
                + ", ".join(LOOKED_FOR.values())
                + "); run it where the batch commands work, or pass --scheduler (or HPCRING_INIT_SCHEDULER); "
                f"allowed: {choices(list(LAUNCHER))}"
            )
        return found
    if found is None:
        draft.notes.append(f"scheduler {asked} given with --scheduler; no batch command answered here")
        return BatchFacts(asked)
    if found.scheduler != asked:
        draft.notes.append(
            f"scheduler {asked} given with --scheduler; {found.scheduler} answered here, its queues left out"
        )
        return BatchFacts(asked)
    return found


def site_section(batch: BatchFacts, draft: Draft) -> None:
    sched = batch.scheduler
    site: dict[str, Any] = {"scheduler": sched, "launcher": LAUNCHER[sched]}
    draft.todo_site.append(
        "mpi: the MPI your jobs use (openmpi, mpich, cray-mpich, intel-mpi, spectrum-mpi); default openmpi"
    )
    draft.todo_site.append("account_required: true where every job must name an account (-A / --account)")
    draft.todo_site.append("container: {runtime: apptainer} (or singularity) to run jobs in images")
    partitions = []
    for q in batch.queues:
        if q.max_walltime_s is None:
            draft.todo_partitions.append(
                f"- {{name: {q.name}, max_walltime: ...}}  # no time limit reported; give the site's"
            )
            continue
        entry: dict[str, Any] = {"name": q.name, "max_walltime": walltime.slurm(q.max_walltime_s)}
        if q.max_nodes is not None:
            entry["max_nodes"] = q.max_nodes
        if q.default:
            entry["default"] = True
        entry["selector"] = SELECTOR[sched]
        partitions.append(entry)
    if sum(1 for p in partitions if p.get("default")) > 1:
        for p in partitions[1:]:
            p.pop("default", None)
    site["partitions"] = partitions
    if batch.slurm_mpi:
        site["slurm"] = {"mpi": batch.slurm_mpi}
    draft.notes.extend(batch.notes)
    draft.site = site


def compose(
    files: sysfs.Files, out: Outputs, name: str | None, hostname: str, scheduler: str | None = None
) -> Draft:
    """The draft profile from /sys files and tool outputs (`scheduler`: what --scheduler asked for)."""
    draft = Draft(name="", sources=[], node={}, site={})
    facts = cpu_facts(files, out, draft.notes, draft.sources)
    gpus, attached, vendor = gpu_facts(out, draft.sources)
    sys_nics, interconnect = sysfs.nics(files)
    if sys_nics:
        draft.sources.append("/sys/class (NICs)")
    node_section(facts, gpus, vendor, merge_nics(sys_nics, attached), interconnect, draft)
    site_section(chosen_batch(batch_facts(out, draft.sources), scheduler, draft), draft)
    cluster = next((n.split("=", 1)[1] for n in draft.notes if n.startswith("Slurm ClusterName=")), None)
    draft.name = clean_name(name or cluster or re.sub(r"\d+$", "", hostname.split(".")[0]))
    return draft
