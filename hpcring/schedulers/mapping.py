"""RankMap: which node, CPUs (hardware threads), GPUs and NIC every rank gets.

All nodes of a profile are identical, so the placement is computed once per distinct ranks-per-node count
(one, or two when ranks do not divide evenly and the profile allows it) and replicated, and ranks are produced
lazily: a machine-size job maps about as fast as a small one (timings in docs/dev/schedulers.md).

Invariants (checked by property tests): no CPU is given to two ranks of a node; in isolated and shared mode
alike each GPU is given to one rank; a rank's CPUs lie in its GPUs' NUMA domains whenever those domains have
room; reserved cores are never used; ranks are numbered contiguously per node (block distribution).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hpcring.errors import ConfigError, JobShapeError, choices
from hpcring.schedulers import walltime
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.model import Node, NumaDomain, Partition, Profile


@dataclass(frozen=True)
class Shape:
    """The job's shape with every default resolved against the profile."""

    nodes: int
    ranks: int
    ranks_per_node: tuple[int, ...]  # distinct per-node counts, largest first (len 1 when even)
    extra_nodes: int  # nodes (the first ones) that hold ranks_per_node[0] when the split is uneven
    gpus_per_rank: int
    cpus_per_rank: int  # physical cores
    threads_per_core: int
    time_s: int
    partition: Partition | None

    @property
    def max_ranks_per_node(self) -> int:
        return self.ranks_per_node[0]

    @property
    def even(self) -> bool:
        return len(self.ranks_per_node) == 1

    def ranks_on(self, node: int) -> int:
        """Ranks placed on node `node`."""
        if self.even or node < self.extra_nodes:
            return self.ranks_per_node[0]
        return self.ranks_per_node[1]


@dataclass(frozen=True)
class Slot:
    """One rank's resources on its node."""

    local_rank: int
    gpus: tuple[int, ...]  # node numbering
    gpu_sched: tuple[int, ...]  # scheduler numbering (map_gpu, ERF)
    cores: tuple[int, ...]
    cpus: tuple[int, ...]  # hardware threads, OS numbering
    nic: str | None
    nics: tuple[str, ...] = ()  # every NIC the rank owns (several when NICs hang off its GPUs); nic = first
    tiles: tuple[tuple[int, int], ...] = ()  # (device, tile) of each GPU tile (Intel Max): ZE_AFFINITY_MASK
    mem_numa: tuple[int, ...] = ()  # NUMA domains the rank's memory belongs on (its GPUs', else its cores')
    apu: bool = False  # its GPUs share package and memory with its cores (MI300A): bind memory too

    def record(self) -> dict[str, object]:
        """The node-local part of a `hpcring map --format json` record.

        Keys beyond the v1 ones appear only where the node has the feature: `tiles` on tiled GPUs, `nics`
        when a rank owns several, `mem_numa` on APUs.
        """
        out: dict[str, object] = {
            "local_rank": self.local_rank,
            "gpus": list(self.gpus),
            "cpus": list(self.cpus),
            "nic": self.nic,
        }
        if self.tiles:
            out["tiles"] = [f"{device}.{tile}" for device, tile in self.tiles]
        if len(self.nics) > 1:
            out["nics"] = list(self.nics)
        if self.apu:
            out["mem_numa"] = list(self.mem_numa)
        return out


@dataclass(frozen=True)
class Rank:
    """A rank of the job: its number, node index and slot."""

    rank: int
    node: int
    slot: Slot

    def as_dict(self) -> dict[str, object]:
        """The `hpcring map --format json` record."""
        return {"rank": self.rank, "node": self.node, **self.slot.record()}


@dataclass(frozen=True)
class RankMap:
    """Placement of every rank; `layouts[i]` is the slot list of a node holding `shape.ranks_per_node[i]`
    ranks."""

    profile: Profile
    shape: Shape
    layouts: tuple[tuple[Slot, ...], ...]

    def slots(self, node: int) -> tuple[Slot, ...]:
        """Slots of node `node` (local rank order)."""
        s = self.shape
        return self.layouts[0] if s.even or node < s.extra_nodes else self.layouts[1]

    def first_rank(self, node: int) -> int:
        """Global rank of local rank 0 on `node` (block distribution)."""
        s = self.shape
        big = s.ranks_per_node[0]
        if s.even:
            return node * big
        small = s.ranks_per_node[1]
        return node * big if node < s.extra_nodes else s.extra_nodes * big + (node - s.extra_nodes) * small

    def ranks(self) -> Iterator[Rank]:
        """Every rank in order."""
        rank = 0
        for node in range(self.shape.nodes):
            for slot in self.slots(node):
                yield Rank(rank, node, slot)
                rank += 1

    def as_json_list(self) -> list[dict[str, object]]:
        return [r.as_dict() for r in self.ranks()]

    def json_lines(self) -> Iterator[str]:
        """Each rank's JSON record (as `Rank.as_dict`), serialised once per slot and reused on every node."""
        tails = [[json.dumps(s.record())[1:] for s in layout] for layout in self.layouts]
        rank = 0
        for node in range(self.shape.nodes):
            layout = tails[0] if self.shape.even or node < self.shape.extra_nodes else tails[1]
            for tail in layout:
                yield f'{{"rank": {rank}, "node": {node}, {tail}'
                rank += 1


def usable_domains(node: Node) -> list[NumaDomain]:
    """NUMA domains with at least one usable core (CPU-only ranks are spread over these)."""
    return [d for d in node.numa if set(d.cores) - node.reserved_cores]


def default_ranks_per_node(node: Node, gpus_per_rank: int) -> int:
    """One rank per GPU (per `gpus_per_rank` GPUs); CPU-only: one per NUMA domain with usable cores."""
    if gpus_per_rank > 0:
        return max(1, len(node.gpus) // gpus_per_rank)
    return len(usable_domains(node))


def _split_ranks(profile: Profile, job: JobSpec) -> tuple[tuple[int, ...], int]:
    """Per-node rank counts (largest first) and how many leading nodes hold the larger count."""
    n = job.nodes
    if job.ranks is not None and job.ranks_per_node is not None and job.ranks != job.ranks_per_node * n:
        raise JobShapeError(
            f"ranks ({job.ranks}) != nodes ({n}) x ranks per node ({job.ranks_per_node}); give one of them"
        )
    if job.ranks is None:
        gpr = job.gpus_per_rank if job.gpus_per_rank is not None else (1 if profile.node.gpus else 0)
        rpn = job.ranks_per_node or default_ranks_per_node(profile.node, gpr)
        return (rpn,), 0
    if job.ranks < n:
        raise JobShapeError(f"{job.ranks} ranks cannot fill {n} nodes; use at most {job.ranks} nodes")
    base, extra = divmod(job.ranks, n)
    if extra == 0:
        return (base,), 0
    if profile.site.require_even_ranks:
        raise JobShapeError(
            f"{job.ranks} ranks do not divide evenly over {n} nodes, and profile {profile.name!r} requires "
            f"the same number of ranks on every node; use a multiple of {n} "
            f"(e.g. {base * n} or {(base + 1) * n})"
        )
    return (base + 1, base), extra


def resolve(profile: Profile, job: JobSpec) -> Shape:
    """Apply the profile's defaults to `job` and refuse shapes the nodes cannot hold, saying why."""
    node, site = profile.node, profile.site
    if job.nodes < 1:
        raise JobShapeError(f"nodes must be at least 1, got {job.nodes}")
    gpr = job.gpus_per_rank if job.gpus_per_rank is not None else (1 if node.gpus else 0)
    if gpr > 0 and not node.gpus:
        raise JobShapeError(f"{gpr} GPU(s) per rank asked, but profile {profile.name!r} nodes have no GPUs")
    _check_gpu_groups(profile, gpr)
    counts, extra = _split_ranks(profile, job)
    rpn = counts[0]
    if gpr * rpn > len(node.gpus):
        raise JobShapeError(
            f"more GPUs than the node has: {rpn} ranks x {gpr} GPU(s) = {rpn * gpr} > {len(node.gpus)} "
            f"GPUs per node on {profile.name!r}"
        )
    tpc = job.threads_per_core if job.threads_per_core is not None else site.smt
    if not 1 <= tpc <= node.threads_per_core:
        raise JobShapeError(
            f"threads per core {tpc} is not possible; the node has {node.threads_per_core} hardware "
            "thread(s) per core"
        )
    usable = len(node.usable_cores)
    if rpn > usable:
        raise JobShapeError(
            f"cores oversubscribed: {rpn} ranks per node > {usable} usable cores "
            f"({len(node.reserved_cores)} reserved)"
        )
    if job.cpus_per_rank is not None and job.cpus_per_rank * rpn > usable:
        raise JobShapeError(
            f"cores oversubscribed: {rpn} ranks x {job.cpus_per_rank} cores = {rpn * job.cpus_per_rank} > "
            f"{usable} usable cores per node ({len(node.reserved_cores)} reserved)"
        )
    cpr = job.cpus_per_rank if job.cpus_per_rank is not None else default_cpus_per_rank(node, rpn, gpr)
    part = _partition(profile, job)
    time_s = _walltime(profile, job, part)
    return Shape(job.nodes, job.ranks or rpn * job.nodes, counts, extra, gpr, cpr, tpc, time_s, part)


def _check_gpu_groups(profile: Profile, gpr: int) -> None:
    """Refuse GPUs per rank that do not divide the node's GPUs.

    Ranks take consecutive GPUs, so 3 of 8 GCDs leaves two idle on every node and gives a rank GPUs from two
    NUMA domains (3-5 on a Frontier node); no built-in site documents such a layout. The divisors keep every
    GPU busy and every group aligned.
    """
    total = len(profile.node.gpus)
    if gpr > 0 and total % gpr:
        allowed = [d for d in range(1, total + 1) if total % d == 0]
        raise JobShapeError(
            f"--gpus-per-rank (gpus_per_rank) {gpr} does not divide the {total} GPUs of a {profile.name!r} "
            f"node: {total % gpr} would stay idle and a rank's GPUs could span NUMA domains; allowed: "
            f"{choices([0, *allowed])} (0: CPU-only ranks)"
        )


def _partition(profile: Profile, job: JobSpec) -> Partition | None:
    part = profile.site.partition(job.partition)
    if job.partition is not None and part is None:
        names = [p.name for p in profile.site.partitions]
        if not names:
            return Partition(
                job.partition, 0
            )  # the profile knows no partitions: pass the name through unchecked
        raise ConfigError(
            f"unknown partition {job.partition!r} on {profile.name!r}; allowed: {choices(names)}"
        )
    if part is not None and part.max_nodes is not None and job.nodes > part.max_nodes:
        raise JobShapeError(
            f"{job.nodes} nodes exceed the {part.max_nodes}-node limit of {part.selector} {part.name!r} "
            f"on {profile.name!r}{_fitting(profile, job)}"
        )
    if part is not None and job.nodes < part.min_nodes:
        raise JobShapeError(
            f"{job.nodes} node(s) are below the {part.min_nodes}-node minimum of {part.selector} "
            f"{part.name!r} on {profile.name!r}{_fitting(profile, job)}"
        )
    return part


def _fitting(profile: Profile, job: JobSpec) -> str:
    """The end of a size or walltime refusal: which of the profile's queues would take this job (its nodes,
    and its walltime when one was asked), so that the user learns the fix and not only the limit."""
    nodes, wanted = job.nodes, job.time_s
    fits = [
        p
        for p in profile.site.partitions
        if p.min_nodes <= nodes <= (p.max_nodes or nodes)
        and (wanted is None or not p.max_walltime_s or wanted <= p.walltime_limit(nodes))
    ]
    what = f"{nodes} node(s)" + (f" for {walltime.human(wanted)}" if wanted is not None else "")
    if not fits:
        return f"; no partition, QOS or queue of {profile.name!r} takes {what}"
    return f"; {what} fit {choices([p.name for p in fits])} (--partition NAME)"


def _walltime(profile: Profile, job: JobSpec, part: Partition | None) -> int:
    limit = part.walltime_limit(job.nodes) if part is not None and part.max_walltime_s else None
    if job.time_s is None:
        return min(3600, limit) if limit else 3600
    if limit is not None and part is not None and job.time_s > limit:
        raise JobShapeError(
            f"walltime {walltime.human(job.time_s)} exceeds the limit of {walltime.human(limit)} for "
            f"{job.nodes} node(s) in {part.selector} {part.name!r} on {profile.name!r}"
            f"{_fitting(profile, job)}"
        )
    return job.time_s


def _preferences(
    node: Node, rpn: int, gpr: int
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Per local rank: (its GPUs by position, preferred cores, same-NUMA fallback cores), usable cores
    only."""
    usable = set(node.usable_cores)
    doms = {d.id: d for d in node.numa}
    cpu_domains = usable_domains(node)
    out = []
    for i in range(rpn):
        if gpr > 0:
            gpus = tuple(range(i * gpr, (i + 1) * gpr))
            pref = sorted({c for g in gpus for c in node.gpus[g].closest_cores} & usable)
            near = sorted({c for g in gpus for c in doms[node.gpus[g].numa].cores} & usable)
        else:
            gpus = ()
            dom = cpu_domains[i * len(cpu_domains) // rpn]
            pref = near = sorted(set(dom.cores) & usable)
        out.append((gpus, tuple(pref), tuple(near)))
    return out


def default_cpus_per_rank(node: Node, rpn: int, gpr: int) -> int:
    """Even share of the closest cores among the ranks that prefer them, capped so that all ranks fit."""
    prefs = _preferences(node, rpn, gpr)
    groups: dict[tuple[int, ...], int] = {}
    for _, pref, _ in prefs:
        groups[pref] = groups.get(pref, 0) + 1
    share = min((len(pref) // count for pref, count in groups.items()), default=0)
    cap = len(node.usable_cores) // rpn
    return max(1, min(share, cap)) if share else max(1, cap)


def layout(node: Node, rpn: int, gpr: int, cpr: int, tpc: int) -> tuple[Slot, ...]:
    """Slots of one node: GPUs in index order, cores from the closest set, then the NUMA domain, then
    anywhere.

    Ranks confined to one NUMA domain choose first, so ranks whose GPUs span domains cannot take the cores a
    local rank needs.
    """
    if cpr * rpn > len(node.usable_cores):
        raise JobShapeError(f"cores oversubscribed: {rpn} x {cpr} > {len(node.usable_cores)} usable cores")
    prefs = _preferences(node, rpn, gpr)
    free = set(node.usable_cores)
    cores_of: dict[int, tuple[int, ...]] = {}

    def span(i: int) -> int:
        return len({node.numa_of_core(c) for c in prefs[i][2]})

    for i in sorted(range(rpn), key=lambda i: (span(i), len(prefs[i][1]), i)):
        _, pref, near = prefs[i]
        chosen: list[int] = []
        for pool in (pref, near, sorted(free)):
            for c in pool:
                if len(chosen) == cpr:
                    break
                if c in free:
                    chosen.append(c)
                    free.discard(c)
        cores_of[i] = tuple(sorted(chosen))
    nics = _nics(node, prefs, cores_of)
    slots = []
    for i in range(rpn):
        gpus = [node.gpus[g] for g in prefs[i][0]]
        cores = cores_of[i]
        cpus = tuple(sorted(t for c in cores for t in node.hw_threads(c, tpc)))
        domains = {g.numa for g in gpus} if gpus else {node.numa_of_core(c) for c in cores}
        slots.append(
            Slot(
                local_rank=i,
                gpus=tuple(g.index for g in gpus),
                gpu_sched=tuple(g.scheduler_index for g in gpus),
                cores=cores,
                cpus=cpus,
                nic=nics[i][0] if nics[i] else None,
                nics=nics[i],
                tiles=tuple((g.device, g.tile) for g in gpus if g.device is not None and g.tile is not None),
                mem_numa=tuple(sorted(d for d in domains if d is not None)),
                apu=any(g.apu for g in gpus),
            )
        )
    return tuple(slots)


def _nics(
    node: Node,
    prefs: Sequence[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
    cores_of: dict[int, tuple[int, ...]],
) -> list[tuple[str, ...]]:
    """NICs per rank: every NIC attached to the rank's GPUs when the profile says which; otherwise one in
    the rank's GPU (or CPU) NUMA domain, round-robin among equals; else any, round-robin."""
    if not node.nics:
        return [()] * len(prefs)
    used: dict[tuple[str, ...], int] = {}
    out: list[tuple[str, ...]] = []
    for i, (gpus, _, _) in enumerate(prefs):
        indexes = {node.gpus[g].index for g in gpus}
        attached = tuple(n.name for n in node.nics if indexes & set(n.gpus))
        if attached:
            out.append(attached)
            continue
        domains = {node.gpus[g].numa for g in gpus} if gpus else {node.numa_of_core(c) for c in cores_of[i]}
        local = tuple(n.name for n in node.nics if n.numa is not None and n.numa in domains)
        pool = local or tuple(n.name for n in node.nics)
        k = used.get(pool, 0)
        used[pool] = k + 1
        out.append((pool[k % len(pool)],))
    return out


def in_core_order(slots: Sequence[Slot]) -> tuple[Slot, ...]:
    """The same slots, local ranks renumbered so that local rank 0 has the lowest cores (rank_order: cores).

    Only the numbering changes: each slot keeps its GPUs, cores, NICs and memory domains.
    """
    ordered = sorted(slots, key=lambda s: (min(s.cores, default=0), s.local_rank))
    return tuple(dataclasses.replace(s, local_rank=i) for i, s in enumerate(ordered))


def build(profile: Profile, job: JobSpec) -> RankMap:
    """Resolve the job's shape and place every rank."""
    shape = resolve(profile, job)
    layouts = tuple(
        layout(profile.node, rpn, shape.gpus_per_rank, shape.cpus_per_rank, shape.threads_per_core)
        for rpn in shape.ranks_per_node
    )
    if profile.site.rank_order == "cores":
        layouts = tuple(in_core_order(slots) for slots in layouts)
    return RankMap(profile, shape, layouts)
