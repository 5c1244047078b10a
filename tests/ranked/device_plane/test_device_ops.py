"""allgather, broadcast, alltoall and reducescatter through the device data plane, joined ranks, process sets
(each with process groups of its own, released when the set is removed)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from device_cases import DEVICE, plane_stats


def test_allgather_ragged(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((r + 1, 3), float(r), device=DEVICE)
    g = hvd.allgather(x, name="ag.ragged")
    assert g.device == x.device and g.shape == (n * (n + 1) // 2, 3)
    assert g[:, 0].cpu().tolist() == [float(q) for q in range(n) for _ in range(q + 1)]
    same = hvd.allgather(torch.full((2,), r, dtype=torch.int64, device=DEVICE), name="ag.equal")
    assert same.cpu().tolist() == [q for q in range(n) for _ in range(2)]


def test_allgather_autograd(hvd: ModuleType) -> None:
    r = hvd.rank()
    x = torch.full((2,), float(r + 1), device=DEVICE, requires_grad=True)
    hvd.allgather(x, name="ag.grad").sum().backward()
    assert x.grad is not None and torch.allclose(x.grad.cpu(), torch.ones(2))  # Average of ones


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_broadcast(hvd: ModuleType, dtype: torch.dtype) -> None:
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = (torch.arange(6) + 10 * r).reshape(2, 3).to(dtype).to(DEVICE)
    want = (torch.arange(6) + 10 * root).reshape(2, 3).to(dtype)
    b = hvd.broadcast(x, root_rank=root, name=f"bc.{dtype}")
    assert torch.equal(b.cpu(), want) and torch.equal(
        x.cpu(), (torch.arange(6) + 10 * r).reshape(2, 3).to(dtype)
    )
    assert hvd.broadcast_(x, root_rank=root, name=f"bc.inplace.{dtype}") is x
    assert torch.equal(x.cpu(), want)


def test_alltoall_with_and_without_splits(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.arange(2 * n, dtype=torch.float32, device=DEVICE) + 100 * r
    out = hvd.alltoall(x, name="a2a.equal")
    assert out.cpu().tolist() == [100.0 * q + 2 * r + k for q in range(n) for k in range(2)]
    splits = torch.tensor([j + 1 for j in range(n)], dtype=torch.int32)  # rank r sends j + 1 rows to j
    rows = torch.cat([torch.full((j + 1, 2), float(10 * r + j)) for j in range(n)]).to(DEVICE)
    got, received = hvd.alltoall(rows, splits=splits, name="a2a.splits")
    assert received.tolist() == [r + 1] * n and received.dtype == torch.int32
    assert got.shape == (n * (r + 1), 2)
    assert got[:, 1].cpu().tolist() == [float(10 * q + r) for q in range(n) for _ in range(r + 1)]


@pytest.mark.parametrize("op", ["sum", "average"])
def test_reducescatter_uneven_rows(hvd: ModuleType, op: str) -> None:
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # rank 0 gets one row more
    x = (torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + r).to(DEVICE)
    out = hvd.reducescatter(x, op=getattr(hvd, op.capitalize()), name=f"rs.{op}")
    mine = 3 if r == 0 else 2
    start = 0 if r == 0 else 3 + 2 * (r - 1)
    full = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * n + n * (n - 1) / 2
    want = full[start : start + mine] / (n if op == "average" else 1)
    assert out.shape == (mine, 2) and torch.allclose(out.cpu(), want)


def test_reducescatter_scale_factors_and_integers(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((2 * n, 3), 3 * (r + 1), dtype=torch.int32, device=DEVICE)
    out = hvd.reducescatter(x, op=hvd.Average, name="rs.int")
    assert out.cpu().tolist() == [[int(3 * n * (n + 1) / 2 / n)] * 3] * 2
    y = torch.full((n, 2), float(r + 1), device=DEVICE)
    s = hvd.reducescatter(y, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="rs.scale")
    assert torch.allclose(s.cpu(), torch.full((1, 2), 2.0 * n * (n + 1) / 2 * 0.25))


def test_joined_ranks_are_refused_by_the_other_ops(hvd: ModuleType, comm: Any) -> None:
    """Device tensors follow the same join rule as host ones (Horovod's): with rank 0 joined, allgather,
    reducescatter and broadcast fail on every other rank; allreduce goes on. Every rank learns the same last
    joined rank (which of the others joins last depends on timing; never rank 0, which joined first)."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a rank that joins while others submit")
    if r == 0:
        last = hvd.join()
        assert 0 < last < n and comm.allgather(last) == [last] * n
        return
    x = torch.full((n, 2), float(r), device=DEVICE)
    for call in (
        lambda: hvd.allgather(x, name="join.ag"),
        lambda: hvd.reducescatter(x, op=hvd.Sum, name="join.rs"),
        lambda: hvd.broadcast(x, root_rank=n - 1, name="join.bc"),
    ):
        with pytest.raises(hvd.HorovodInternalError, match="not supported with join"):
            call()
    y = hvd.allreduce(torch.ones(2, device=DEVICE), op=hvd.Sum, name="join.ar")
    assert y.cpu().tolist() == [float(n - 1)] * 2
    last = hvd.join()
    assert 0 < last < n and comm.allgather(last) == [last] * n


def test_process_sets_have_their_own_process_groups(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two ranks")
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    odds = hvd.add_process_set([q for q in range(n) if q % 2 == 1])
    mine = evens if r % 2 == 0 else odds
    before = plane_stats()
    y = hvd.allreduce(torch.full((3,), float(r), device=DEVICE), op=hvd.Sum, process_set=mine, name="ps")
    assert y.cpu().tolist() == [float(sum(mine.ranks))] * 3
    g = hvd.allgather(torch.tensor([r], device=DEVICE), process_set=mine, name="ps.ag")
    assert g.cpu().tolist() == mine.ranks
    b = hvd.broadcast(torch.tensor([float(r)], device=DEVICE), root_rank=mine.ranks[-1], process_set=mine)
    assert b.item() == mine.ranks[-1]
    assert plane_stats()["planes"] == before["planes"] + 1  # built on the set's first device batch
    assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)
    assert plane_stats()["released"] == before["released"] + 1  # shut down with the set
    z = hvd.allreduce(torch.ones(2, device=DEVICE), op=hvd.Sum, name="ps.after")  # the global set is fine
    assert z.cpu().tolist() == [float(n)] * 2
