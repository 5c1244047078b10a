"""What each device route does beyond the results: which process groups it builds (none that it does not
need), how a fused step trains, and on CUDA how the communication stream is ordered against the caller's."""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

import pytest
import torch
from device_cases import CUDA, DEVICE, ROUTE, hierarchical_forced, plane_stats

STEPS, BATCH = 4, 3


def test_training_equals_one_process_on_the_global_batch(hvd: ModuleType) -> None:
    """The data-parallel proof on this launch's route: STEPS DistributedOptimizer steps at n ranks, batch
    BATCH each, give the weights of one process training on the n*BATCH batch (computed here too)."""
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(5)
    reference = torch.nn.Sequential(
        torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )
    model = copy.deepcopy(reference).to(DEVICE)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), named_parameters=model.named_parameters()
    )
    gen = torch.Generator().manual_seed(23)
    x = torch.randn(STEPS * n * BATCH, 6, generator=gen)
    y = torch.randint(0, 3, (STEPS * n * BATCH,), generator=gen)
    model.eval(), reference.eval()  # BatchNorm with running stats: the same function on any batch split
    for s in range(STEPS):
        lo = s * n * BATCH
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(
            reference(x[lo : lo + n * BATCH]), y[lo : lo + n * BATCH]
        ).backward()
        ref_opt.step()
        mine = slice(lo + r * BATCH, lo + (r + 1) * BATCH)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[mine].to(DEVICE)), y[mine].to(DEVICE)).backward()
        opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    assert plane_stats()["batches"] > 0  # the gradients took the device plane


def test_one_rank_per_node_crosses_over_mpi_without_a_world_group(hvd: ModuleType) -> None:
    """The hierarchical route with one rank per node: the allreduce is the cross-node stage alone, over MPI
    from host memory; the other ops go over MPI between nodes too; no process group spans the nodes (two
    ranks on one GPU could not share one)."""
    if not (hierarchical_forced() and hvd.local_size() == 1) or ROUTE.endswith("+mpi"):
        pytest.skip("needs one rank per emulated node, the hierarchical route forced, a process-group route")
    n, r = hvd.size(), hvd.rank()
    before = plane_stats()
    y = hvd.allreduce(torch.full((1000,), float(r), device=DEVICE), op=hvd.Sum, name="one.ar")
    g = hvd.allgather(torch.tensor([r, r], device=DEVICE), name="one.ag")
    b = hvd.broadcast(torch.tensor([float(r)], device=DEVICE), root_rank=n - 1, name="one.bc")
    s = hvd.reducescatter(torch.ones(n, 2, device=DEVICE), op=hvd.Sum, name="one.rs")
    assert torch.equal(y.cpu(), torch.full((1000,), float(n * (n - 1) // 2)))
    assert g.cpu().tolist() == [q for q in range(n) for _ in range(2)] and b.item() == n - 1
    assert torch.equal(s.cpu(), torch.full((1, 2), float(n)))
    after = plane_stats()
    assert after.get("groups_world", 0) == 0 and after.get("groups_local", 0) == 0, after
    assert after["hierarchical"] == before["hierarchical"] + 1
    assert after.get("cross_mpi", 0) == before.get("cross_mpi", 0) + 1
    assert after["staged"] == before["staged"] + 3  # allgather, broadcast, reducescatter


def test_a_set_of_one_rank_builds_no_process_group(hvd: ModuleType) -> None:
    """Sets of one rank (the global set at one rank) move nothing between ranks: no process group."""
    r = hvd.rank()
    alone = [hvd.add_process_set([q]) for q in range(hvd.size())] if hvd.size() > 1 else []
    try:
        before = plane_stats()
        mine = alone[r] if alone else hvd.global_process_set
        y = hvd.allreduce(torch.full((5,), 3.0, device=DEVICE), op=hvd.Average, process_set=mine)
        g = hvd.allgather(torch.ones(2, device=DEVICE), process_set=mine, name="alone.ag")
        assert torch.equal(y.cpu(), torch.full((5,), 3.0)) and g.shape == (2,)
        after = plane_stats()
        built = [k for k in after if k.startswith("groups_") and after[k] != before.get(k, 0)]
        assert not built, (before, after)
    finally:
        for ps in reversed(alone):
            hvd.remove_process_set(ps)


def test_a_tensor_from_a_side_stream_is_read_after_it_is_written(hvd: ModuleType) -> None:
    """CUDA: the communication stream waits for the stream that produced the tensor (an event), so a tensor
    written on a user's side stream is reduced with its new values; the result is readable on another
    stream after synchronize()."""
    if not CUDA:
        pytest.skip("CUDA streams")
    n, r = hvd.size(), hvd.rank()
    side = torch.cuda.Stream(DEVICE)
    x = torch.zeros(1 << 20, device=DEVICE)
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)  # keep the side stream busy, so an unordered read would see zeros
        x.fill_(float(r + 1))
        h = hvd.allreduce_async_(x, op=hvd.Sum, name="side.stream")
    hvd.synchronize(h)
    other = torch.cuda.Stream(DEVICE)
    with torch.cuda.stream(other):
        assert x[0].item() == n * (n + 1) / 2 and x[-1].item() == n * (n + 1) / 2


def test_handles_of_a_batch_share_its_completion_event(hvd: ModuleType) -> None:
    """CUDA: a fused batch's handles carry the event recorded on the communication stream after it; poll()
    turns true only when that event has completed."""
    if not CUDA:
        pytest.skip("CUDA streams")
    from hpcring.torch import op_handles

    tensors = [torch.full((k + 3,), 1.0, device=DEVICE) for k in range(4)]
    handle = hvd.grouped_allreduce_async_(tensors, op=hvd.Sum, name="events")
    pending: Any = op_handles._handle_map[handle]
    for h in pending.handles:
        h.wait()
    events = {id(h.event) for h in pending.handles}
    assert len(events) == 1 and None not in {h.event for h in pending.handles}
    hvd.synchronize(handle)
    assert all(t[0].item() == hvd.size() for t in tensors)
