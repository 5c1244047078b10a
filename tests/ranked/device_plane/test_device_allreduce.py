"""Allreduce through the engine's device data plane (hpcring/engine/device_plane.py): every reduce op and
dtype, scale factors, fusion of mixed sizes, in place and out of place, grouped, join, autograd.

Launched at 2 and 4 ranks and on 2 emulated nodes x 2 with the hierarchical allreduce forced (then every
allreduce here takes the three-stage route; `test_the_route_taken` checks which one ran)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from device_cases import DEVICE, MPI_ROUTE, ROUTE, hierarchical_forced, plane_stats, values

OPS = ["sum", "average", "min", "max", "product"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]


def expected(op: str, n: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The reduction of every rank's `values`, computed here in int64 (exact), cast like the engine's."""
    stack = torch.stack([values(q, length) for q in range(n)])
    if op == "sum":
        out = stack.sum(0)
    elif op == "average":  # floats: exact (n is 2 or 4); integers truncate, as Horovod
        s = stack.sum(0)
        return (
            (s.double() / n).to(dtype) if dtype.is_floating_point else torch.trunc(s.double() / n).to(dtype)
        )
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return out.to(dtype)


def test_the_route_taken(hvd: ModuleType) -> None:
    """Tensors take the device route (not numpy): the signature names it, the device plane counts the batch,
    and on 2 emulated nodes with hierarchical forced the three-stage allreduce ran."""
    from hpcring.torch import tensors

    n = hvd.size()
    t = torch.ones(1000, device=DEVICE)
    assert tensors._view(t).device == ROUTE
    before = plane_stats()
    y = hvd.allreduce(t, op=hvd.Sum, name="route")
    after = plane_stats()
    assert y.device == t.device and torch.equal(y.cpu(), torch.full((1000,), float(n)))
    assert after["batches"] == before["batches"] + 1
    assert after["hierarchical"] == before["hierarchical"] + (1 if hierarchical_forced() else 0)


def test_process_groups_take_the_collective_timeout(hvd: ModuleType) -> None:
    """Work queued on a device's streams is bounded by torch.distributed's own watchdog: every process group
    the device plane built has HPCRING_COLLECTIVE_TIMEOUT as its timeout (the MPI route builds none)."""
    from hpcring.torch import basics

    hvd.allreduce(torch.ones(4, device=DEVICE), name="timeout.probe")
    engine = basics.engine()
    planes = [sp for by_route in engine.device_plane._sets.values() for sp in by_route.values()]
    groups = [g for sp in planes for lane in sp.lanes for g in lane._groups.values()]
    if ROUTE.endswith("+mpi") or (hvd.size() > 1 and hvd.local_size() == 1):
        # The MPI route, or one rank per node: its cross-node stage (and every other op of the set) runs
        # over MPI from host memory, so no process group exists to take the timeout.
        assert not groups
        return
    assert groups
    want = engine.settings.collective_timeout_s
    assert want == 300.0  # the default: the launches do not set it
    assert all(g.pg.options._timeout.total_seconds() == want for g in groups)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_ops_and_dtypes(hvd: ModuleType, op: str, dtype: torch.dtype) -> None:
    n, r = hvd.size(), hvd.rank()
    length = 7  # odd: on 2 nodes x 2 the hierarchical route pads to a multiple of the node size
    x = values(r, length).to(dtype).to(DEVICE)
    original = x.clone()
    y = hvd.allreduce(x, op=getattr(hvd, op.capitalize()), name=f"ops.{op}.{dtype}")
    assert y.dtype == dtype and y.device == x.device
    assert torch.equal(y.cpu(), expected(op, n, length, dtype)), (op, dtype, y)
    assert torch.equal(x, original)  # out of place: the input is untouched


@pytest.mark.parametrize("op", OPS)
def test_int16_takes_the_mpi_route(hvd: ModuleType, op: str) -> None:
    """NCCL has no int16 (gloo, its CPU stand-in, rejects it too): such tensors take their device's MPI
    route (staged through host memory, reduced over MPI) instead of failing, and come back on their device
    with the exact result."""
    from hpcring.torch import tensors

    n, r = hvd.size(), hvd.rank()
    x = values(r, 7).to(torch.int16).to(DEVICE)
    assert tensors._view(x).device == MPI_ROUTE
    before = plane_stats()
    y = hvd.allreduce(x, op=getattr(hvd, op.capitalize()), name=f"int16.{op}")
    assert plane_stats()["staged"] == before["staged"] + (n > 1)  # one rank moves nothing
    assert y.dtype == torch.int16 and y.device == x.device
    assert torch.equal(y.cpu(), expected(op, n, 7, torch.int16)), (op, y)
    gathered = hvd.allgather(x, name=f"int16.gather.{op}")
    assert torch.equal(gathered.cpu(), torch.cat([values(q, 7).to(torch.int16) for q in range(n)]))


def test_bool_min_is_and_max_is_or(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.tensor([True, r == 0, r != 0, False], device=DEVICE)
    lo = hvd.allreduce(x, op=hvd.Min, name="bool.min")
    hi = hvd.allreduce(x, op=hvd.Max, name="bool.max")
    assert lo.cpu().tolist() == [True, n == 1, False, False]
    assert hi.cpu().tolist() == [True, True, n > 1, False]


def test_in_place_and_non_contiguous(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((6,), float(r), device=DEVICE)
    ptr = x.data_ptr()
    assert hvd.allreduce_(x, op=hvd.Sum, name="inplace") is x
    assert x.data_ptr() == ptr and x.cpu().tolist() == [float(n * (n - 1) // 2)] * 6
    m = torch.arange(12, dtype=torch.float32, device=DEVICE).reshape(3, 4) + r
    col = m[:, 1]  # a strided view: reduced through a contiguous copy and written back into `m`
    assert not col.is_contiguous()
    hvd.allreduce_(col, op=hvd.Sum, name="strided")
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1] * n + n * (n - 1) / 2).tolist()
    assert m[:, 1].cpu().tolist() == want
    assert m[:, 0].cpu().tolist() == (torch.arange(0, 12, 4, dtype=torch.float32) + r).tolist()


def test_scale_factors(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    ranks_sum = n * (n + 1) / 2
    x = torch.full((5,), float(r + 1), device=DEVICE)
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scale.sum")
    assert torch.allclose(y.cpu(), torch.full((5,), 1.5 * ranks_sum))
    y = hvd.allreduce(x, op=hvd.Average, postscale_factor=2.0, name="scale.avg")
    assert torch.allclose(y.cpu(), torch.full((5,), 2.0 * ranks_sum / n))
    # Integers: each rank's prescaled input is truncated, then the postscaled sum (Horovod's semantics).
    xi = torch.full((3,), 2 * r + 1, dtype=torch.int32, device=DEVICE)
    yi = hvd.allreduce(xi, op=hvd.Sum, prescale_factor=0.5, postscale_factor=1.5, name="scale.int")
    pre = sum(int((2 * q + 1) * 0.5) for q in range(n))
    assert yi.cpu().tolist() == [int(pre * 1.5)] * 3
    # float16 with 1/3: one rounding of the float32 product, the same as the host path.
    xh = torch.full((4,), float(r + 1), dtype=torch.float16, device=DEVICE)
    yh = hvd.allreduce(xh, op=hvd.Sum, postscale_factor=1 / 3, name="scale.half")
    want = torch.tensor([ranks_sum] * 4, dtype=torch.float32).mul_(1 / 3).half()
    assert torch.equal(yh.cpu(), want)


def test_fused_batch_of_mixed_sizes(hvd: ModuleType) -> None:
    """Many async allreduces of different sizes (one of 1.1 MB, and an empty one) in one cycle: fused into
    the device fusion buffer, each result in its own output, in place and out of place mixed."""
    n, r = hvd.size(), hvd.rank()
    sizes = [1, 3, 0, 1000, 17, 275_000, 2, 64]
    tensors = [torch.full((k,), float(r + i), device=DEVICE) for i, k in enumerate(sizes)]
    handles = []
    for i, t in enumerate(tensors):
        if i % 2:
            handles.append(hvd.allreduce_async_(t, op=hvd.Sum, name=f"mixed.{i}"))
        else:
            handles.append(hvd.allreduce_async(t, op=hvd.Average, name=f"mixed.{i}"))
    for i, (h, k) in enumerate(zip(handles, sizes, strict=True)):
        out = hvd.synchronize(h)
        total = float(n * i + n * (n - 1) // 2)
        want = total if i % 2 else total / n
        assert out.shape == (k,) and torch.equal(out.cpu(), torch.full((k,), want)), i
        if i % 2:
            assert out is tensors[i]


def test_grouped_allreduce(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    tensors = [torch.full((k + 1, 2), float(r * k), device=DEVICE) for k in range(5)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="grouped")
    for k, o in enumerate(outs):
        assert o.shape == (k + 1, 2) and torch.equal(
            o.cpu(), torch.full((k + 1, 2), float(k * n * (n - 1) / 2))
        )
    same = hvd.grouped_allreduce_(tensors, op=hvd.Max, name="grouped.inplace")
    for k, (o, t) in enumerate(zip(same, tensors, strict=True)):
        assert o is t and torch.equal(t.cpu(), torch.full((k + 1, 2), float(k * (n - 1))))


def test_autograd_through_the_device_plane(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((3,), float(r + 1), device=DEVICE, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="grad.fwd")
    (y * float(r + 1)).sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad.cpu(), torch.full((3,), float(n * (n + 1) / 2)))


@pytest.mark.parametrize("op", ["sum", "average", "min", "max", "product"])
def test_join_contributes_neutral_values(hvd: ModuleType, op: str) -> None:
    """Rank r runs r + 1 steps; a joined rank adds 0 (Sum/Average: Average still divides by the full size),
    or the identity for Min/Max/Product, through fused and lone allreduces alike."""
    n, r = hvd.size(), hvd.rank()
    reduce_op = getattr(hvd, op.capitalize())
    for step in range(r + 1):
        active = list(range(step, n))  # ranks still submitting at this step
        lone = hvd.allreduce(torch.full((5,), float(r + 2), device=DEVICE), op=reduce_op, name=f"join.{op}")
        group = hvd.grouped_allreduce(
            [torch.full((k + 1,), float(r + 2), device=DEVICE) for k in range(3)],
            op=reduce_op,
            name=f"join.{op}.group",
        )
        contrib = [float(q + 2) for q in active]
        want = {
            "sum": sum(contrib),
            "average": sum(contrib) / n,
            "min": min(contrib),
            "max": max(contrib),
            "product": float(torch.tensor(contrib, dtype=torch.float64).prod()),
        }[op]
        assert torch.allclose(lone.cpu(), torch.full((5,), want)), (op, step, lone)
        for k, g in enumerate(group):
            assert torch.allclose(g.cpu(), torch.full((k + 1,), want)), (op, step, k, g)
    assert hvd.join() == n - 1
