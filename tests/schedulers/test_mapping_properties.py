"""Property tests of the mapping invariants over random valid node topologies and job shapes (hypothesis).

Invariants: no hardware thread is given to two ranks of a node; each GPU is given to at most one rank
(isolated and shared alike) and every rank gets exactly its GPUs per rank; reserved cores are never used;
every rank gets `cpus_per_rank` cores and only their threads; ranks are contiguous per node; and whenever
every NUMA domain has room for the ranks that belong to it, each rank's CPUs lie in its GPUs' (or its
assigned) NUMA domain.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, assume, given, settings

from hpcring.errors import JobShapeError
from hpcring.schedulers import cpuset, mapping, profile
from hpcring.schedulers.job import JobSpec
from hpcring.schedulers.model import Node, Profile


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    sockets = draw(st.integers(1, 2))
    cps = draw(st.integers(1, 12))
    tpc = draw(st.integers(1, 4))
    ncores = sockets * cps
    domains: list[list[int]] = []
    for s in range(sockets):
        cores = list(range(s * cps, (s + 1) * cps))
        split = draw(st.integers(1, min(2, cps)))
        cut = len(cores) // split
        domains += [cores[:cut], cores[cut:]] if split == 2 else [cores]
    reserved = draw(st.sets(st.integers(0, ncores - 1), max_size=ncores // 3))
    with_usable = [i for i, d in enumerate(domains) if set(d) - reserved]
    gpus = []
    for index in range(draw(st.integers(0, 8))):
        dom = draw(st.sampled_from(with_usable))
        usable = sorted(set(domains[dom]) - reserved)
        gpu: dict[str, Any] = {"index": index, "numa": dom}
        if draw(st.booleans()):
            first = draw(st.sampled_from(usable))
            extra = draw(st.sets(st.sampled_from(domains[dom])))
            gpu["closest_cores"] = cpuset.format_list({first, *extra})
        gpus.append(gpu)
    nics = [
        {"name": f"nic{i}", "numa": draw(st.one_of(st.none(), st.integers(0, len(domains) - 1)))}
        for i in range(draw(st.integers(0, 3)))
    ]
    data = {
        "schema_version": 1,
        "name": "generated",
        "node": {
            "sockets": sockets,
            "cores_per_socket": cps,
            "threads_per_core": tpc,
            "thread_numbering": draw(st.sampled_from(["compact", "scatter"])),
            "reserved_cores": sorted(reserved),
            "numa": [{"id": i, "cores": cpuset.format_list(d)} for i, d in enumerate(domains)],
            "gpu_visibility": draw(st.sampled_from(["isolated", "shared"])),
            "gpus": gpus,
            "nics": nics,
        },
        "site": {"scheduler": "slurm", "launcher": "srun", "smt": draw(st.integers(1, tpc))},
    }
    return profile.build(data, "generated", "")


def _domains_of(node: Node, slot: mapping.Slot, rpn: int) -> set[int]:
    if slot.gpus:
        by_index = {g.index: g for g in node.gpus}
        return {by_index[g].numa for g in slot.gpus}
    domains = mapping.usable_domains(node)
    return {domains[slot.local_rank * len(domains) // rpn].id}


def check_invariants(prof: Profile, rm: mapping.RankMap) -> None:
    node, shape = prof.node, rm.shape
    ranks = list(rm.ranks())
    assert len(ranks) == shape.ranks
    # contiguous per node, local ranks 0..n-1
    assert [r.rank for r in ranks] == list(range(shape.ranks))
    assert [r.node for r in ranks] == sorted(r.node for r in ranks)
    for n in range(shape.nodes):
        assert [r.slot.local_rank for r in ranks if r.node == n] == list(range(shape.ranks_on(n)))
    for layout in rm.layouts:
        cpus = [c for s in layout for c in s.cpus]
        assert len(cpus) == len(set(cpus)), "a CPU was given to two ranks"
        gpus = [g for s in layout for g in s.gpus]
        assert len(gpus) == len(set(gpus)), "a GPU was given to two ranks"
        for s in layout:
            assert len(s.gpus) == shape.gpus_per_rank
            assert len(s.cores) == shape.cpus_per_rank
            assert not set(s.cores) & node.reserved_cores, "a reserved core was used"
            expected = sorted(t for c in s.cores for t in node.hw_threads(c, shape.threads_per_core))
            assert list(s.cpus) == expected
            assert s.nic is None if not node.nics else s.nic in {nic.name for nic in node.nics}
        # NUMA locality whenever every domain has room for its own ranks
        rpn = len(layout)
        single = [s for s in layout if len(_domains_of(node, s, rpn)) == 1]
        demand: dict[int, int] = {}
        for s in single:
            (d,) = _domains_of(node, s, rpn)
            demand[d] = demand.get(d, 0) + shape.cpus_per_rank
        spanning = len(single) < rpn
        room = all(demand.get(dom.id, 0) <= len(set(dom.cores) - node.reserved_cores) for dom in node.numa)
        if room and not spanning:
            for s in single:
                (d,) = _domains_of(node, s, rpn)
                assert {node.numa_of_core(c) for c in s.cores} == {d}, (s, d)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=profiles(), data=st.data())
def test_mapping_invariants(prof: Profile, data: st.DataObject) -> None:
    node = prof.node
    usable = len(node.usable_cores)
    gpr = data.draw(st.integers(0, 2)) if node.gpus else 0
    rpn = data.draw(st.one_of(st.none(), st.integers(1, max(1, usable + 1))))
    cpr = data.draw(st.one_of(st.none(), st.integers(1, usable)))
    tpc = data.draw(st.one_of(st.none(), st.integers(1, node.threads_per_core)))
    nodes = data.draw(st.integers(1, 3))
    job = JobSpec(nodes=nodes, ranks_per_node=rpn, gpus_per_rank=gpr, cpus_per_rank=cpr, threads_per_core=tpc)
    n_rpn = rpn if rpn is not None else mapping.default_ranks_per_node(node, gpr)
    divides = gpr == 0 or len(node.gpus) % gpr == 0  # GPUs per rank must divide the node's GPUs
    feasible = (
        divides
        and n_rpn * gpr <= len(node.gpus)
        and n_rpn <= usable
        and (cpr is None or cpr * n_rpn <= usable)
    )
    try:
        rm = mapping.build(prof, job)
    except JobShapeError:
        assert not feasible, "a feasible shape was refused"
        return
    assert feasible, "an infeasible shape was accepted"
    check_invariants(prof, rm)


@settings(max_examples=100, deadline=None)
@given(prof=profiles())
def test_default_shape_is_always_feasible(prof: Profile) -> None:
    assume(len(prof.node.gpus) <= len(prof.node.usable_cores))  # one rank per GPU needs a core per GPU
    rm = mapping.build(prof, JobSpec(nodes=2))
    check_invariants(prof, rm)
    if prof.node.gpus:
        assert rm.shape.max_ranks_per_node == len(prof.node.gpus)  # default: one rank per GPU
