"""torch tensor in -> torch tensor out (CPU, zero-copy), including bfloat16; skipped where torch is absent."""

from __future__ import annotations

import pytest

# `tests/torch` can shadow a missing torch as a namespace package: check for the real thing.
torch = pytest.importorskip("torch")
if not hasattr(torch, "Tensor"):
    pytest.skip("torch is not installed in this environment", allow_module_level=True)

import hpcring  # noqa: E402
from hpcring.collective import ReduceOp, Topology  # noqa: E402

torch.set_num_threads(1)

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
DTYPES += [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("algorithm", ("native", "ring", "hierarchical"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_tensor_in_tensor_out(world: Topology, dtype: torch.dtype, algorithm: str) -> None:
    n, r = world.size, world.rank
    t = (torch.arange(37) % 5 + r).to(dtype)
    y = hpcring.allreduce(t, algorithm=algorithm)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == t.shape
    want = (torch.arange(37) % 5 * n + n * (n - 1) // 2).to(dtype)
    assert torch.equal(y, want)
    hpcring.allreduce(t, ReduceOp.MAX, out=t, algorithm=algorithm)
    assert torch.equal(t, (torch.arange(37) % 5 + n - 1).to(dtype))


def test_in_place_writes_through_to_a_grad_tensor(world: Topology) -> None:
    w = torch.full((3, 2), float(world.rank), requires_grad=True)
    hpcring.allreduce(w, ReduceOp.AVERAGE, out=w)
    assert torch.allclose(w.detach(), torch.full((3, 2), (world.size - 1) / 2))


def test_movement_ops_return_tensors(world: Topology) -> None:
    n, r = world.size, world.rank
    g = hpcring.allgather(torch.full((r + 1, 2), r, dtype=torch.bfloat16))
    assert g.dtype == torch.bfloat16 and g.shape == (n * (n + 1) // 2, 2)
    b = hpcring.broadcast(torch.full((4,), r, dtype=torch.bool), root=0)
    assert b.dtype == torch.bool and not b.any()
    x = torch.arange(2 * n, dtype=torch.float16)
    y, splits = hpcring.alltoall(x)
    assert isinstance(y, torch.Tensor) and splits.dtype == torch.int32 and splits.tolist() == [2] * n
    rs = hpcring.reducescatter(torch.ones(n + 1, 3, dtype=torch.float32))
    assert isinstance(rs, torch.Tensor) and rs.shape[0] == (2 if r == 0 else 1)
    nc = torch.zeros(4, 4)
    nc[:, 1] = r
    hpcring.broadcast(nc[:, 1], root=n - 1)
    assert (nc[:, 1] == n - 1).all() and (nc[:, 0] == 0).all()
