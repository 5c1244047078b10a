"""One node of a RankMap as a diagram: sockets, NUMA domains, cores, GPUs and NICs, each with its ranks.

This is the data `hpcring map --plot` draws (hpcring.schedulers.node_plot); it is kept apart from the drawing
so that what a picture shows can be checked without reading pixels, and so that it needs no matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcring.schedulers.mapping import RankMap, Slot
from hpcring.schedulers.model import Node


@dataclass(frozen=True)
class CoreCell:
    """A physical core and the rank bound to it (None: idle; `reserved`: the site keeps it for the system)."""

    core: int
    rank: int | None
    reserved: bool


@dataclass(frozen=True)
class Device:
    """A GPU (or tile) or a NIC, with the ranks bound to it."""

    kind: str  # "gpu" or "nic"
    label: str  # "GPU 4", "GPU 0.1" (a tile), or the NIC's name
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Domain:
    """A NUMA domain of one socket (numa None: the profile gives no NUMA layout for these cores)."""

    socket: int
    numa: int | None
    cores: tuple[CoreCell, ...]
    devices: tuple[Device, ...]  # GPUs and NICs attached to this domain


@dataclass(frozen=True)
class NodeDiagram:
    """Everything one picture of a node shows; `unattached` holds devices with no documented NUMA domain."""

    title: str
    node: int
    ranks: tuple[int, ...]  # the global ranks placed on this node, in local-rank order
    domains: tuple[Domain, ...]
    unattached: tuple[Device, ...]

    def cores_of(self, rank: int) -> tuple[int, ...]:
        """The physical cores the diagram gives `rank`, in core order."""
        return tuple(c.core for d in self.domains for c in d.cores if c.rank == rank)


def build(rm: RankMap, node: int = 0) -> NodeDiagram:
    """The diagram of node `node` of `rm` (0-based; nodes differ only in their rank numbers)."""
    shape = rm.shape
    if not 0 <= node < shape.nodes:
        raise ValueError(f"node {node} is not in the job: it has nodes 0-{shape.nodes - 1}")
    slots = rm.slots(node)
    first = rm.first_rank(node)
    owner = _core_owners(slots, first)
    n = rm.profile.node
    domains = tuple(_domains(n, owner, slots, first))
    placed = {dev.label for d in domains for dev in d.devices}
    unattached = tuple(
        d for d in _devices(n, slots, first, numa=None, any_numa=True) if d.label not in placed
    )
    return NodeDiagram(_title(rm, node), node, tuple(range(first, first + len(slots))), domains, unattached)


def _title(rm: RankMap, node: int) -> str:
    s = rm.shape
    rpn = "/".join(str(r) for r in s.ranks_per_node)
    part = f", partition {s.partition.name}" if s.partition is not None else ""
    return (
        f"{rm.profile.name}: node {node} of {s.nodes} — {s.ranks} ranks, {rpn} per node, "
        f"{s.gpus_per_rank} GPU and {s.cpus_per_rank} cores per rank{part}"
    )


def _core_owners(slots: tuple[Slot, ...], first: int) -> dict[int, int]:
    return {core: first + i for i, slot in enumerate(slots) for core in slot.cores}


def _domains(n: Node, owner: dict[int, int], slots: tuple[Slot, ...], first: int) -> list[Domain]:
    """NUMA domains socket by socket; cores outside every domain form one domain of their socket."""
    out: list[Domain] = []
    for socket in range(n.sockets):
        on_socket = range(socket * n.cores_per_socket, (socket + 1) * n.cores_per_socket)
        seen: set[int] = set()
        for dom in n.numa:
            cores = [c for c in dom.cores if c in on_socket]
            if cores:
                seen.update(cores)
                out.append(_domain(n, socket, dom.id, cores, owner, slots, first))
        rest = [c for c in on_socket if c not in seen]
        if rest:
            out.append(_domain(n, socket, None, rest, owner, slots, first))
    return out


def _domain(
    n: Node,
    socket: int,
    numa: int | None,
    cores: list[int],
    owner: dict[int, int],
    slots: tuple[Slot, ...],
    first: int,
) -> Domain:
    cells = tuple(CoreCell(c, owner.get(c), c in n.reserved_cores) for c in sorted(cores))
    devices = tuple(_devices(n, slots, first, numa=numa)) if numa is not None else ()
    return Domain(socket, numa, cells, devices)


def _devices(
    n: Node, slots: tuple[Slot, ...], first: int, numa: int | None, any_numa: bool = False
) -> list[Device]:
    """The GPUs, then the NICs, of NUMA domain `numa` (all of them with `any_numa`), with their ranks."""
    out: list[Device] = []
    for gpu in n.gpus:
        if any_numa or gpu.numa == numa:
            ranks = tuple(first + i for i, s in enumerate(slots) if gpu.index in s.gpus)
            out.append(Device("gpu", f"GPU {gpu.tile_id or gpu.index}", ranks))
    for nic in n.nics:
        if any_numa or (nic.numa is not None and nic.numa == numa):
            ranks = tuple(first + i for i, s in enumerate(slots) if nic.name in (s.nics or (s.nic,)))
            out.append(Device("nic", nic.name, ranks))
    return out
