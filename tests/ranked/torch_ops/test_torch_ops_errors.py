"""Error contracts: cross-rank mismatches raise on every rank (naming ranks and values), never hang;
what Horovod raises synchronously stays synchronous."""

from __future__ import annotations

import re
from types import ModuleType

import pytest
import torch

from hpcring.errors import ArgumentError


def others(n: int) -> str:
    """How the message lists every rank but 1 (rank 1 is the odd one out in these tests)."""
    rest = [q for q in range(n) if q != 1]
    return ("rank " if len(rest) == 1 else "ranks ") + ", ".join(map(str, rest))


def test_mismatched_shape_raises_on_every_rank(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(5 if r == 1 else 4)
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(x, name="bad_shape")
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "allreduce.bad_shape" in msg and "shape" in msg
    assert f"{others(n)} have (4,)" in msg or f"{others(n)} has (4,)" in msg
    assert "rank 1 has (5,)" in msg
    # the engine is still healthy afterwards
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [float(n)] * 2


def test_mismatched_dtype_op_root_scale(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    with pytest.raises(RuntimeError, match=re.escape("rank 1 has float64")):
        hvd.allreduce(torch.ones(3, dtype=torch.float64 if r == 1 else torch.float32), name="bad_dtype")
    with pytest.raises(RuntimeError, match=r"reduce op: .*rank 1 has max"):
        hvd.allreduce(torch.ones(3), op=hvd.Max if r == 1 else hvd.Sum, name="bad_op")
    with pytest.raises(RuntimeError, match=r"root rank: .*rank 1 has 1"):
        hvd.broadcast(torch.ones(3), root_rank=1 if r == 1 else 0, name="bad_root")
    with pytest.raises(RuntimeError, match=r"prescale factor: .*rank 1 has 2\.0"):
        hvd.allreduce(torch.ones(3), prescale_factor=2.0 if r == 1 else 1.0, name="bad_scale")
    with pytest.raises(RuntimeError, match=r"all dimensions but the first.*rank 1 has \(\*, 3\)"):
        hvd.allgather(torch.ones(2, 3 if r == 1 else 2), name="bad_trailing")
    with pytest.raises(RuntimeError, match=r"shape: .*rank 1 has \(5, 2\)"):
        hvd.reducescatter(torch.ones(5 if r == 1 else 4, 2), name="bad_rs")
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n


def test_mismatch_inside_fused_step_fails_only_that_tensor(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    good = [hvd.allreduce_async(torch.ones(8), name=f"ok.{i}", op=hvd.Sum) for i in range(4)]
    bad = hvd.allreduce_async(torch.ones(3 if r == 1 else 2), name="odd", op=hvd.Sum)
    for h in good:
        assert hvd.synchronize(h).tolist() == [float(n)] * 8
    with pytest.raises(hvd.HorovodInternalError, match="odd"):
        hvd.synchronize(bad)


def test_cached_tensor_changing_shape_on_one_rank(hvd: ModuleType) -> None:
    """After a name is in the response cache, a changed shape on one rank still errors everywhere."""
    n, r = hvd.size(), hvd.rank()
    for _ in range(2):
        assert hvd.allreduce(torch.ones(4), name="cached", op=hvd.Sum).tolist() == [float(n)] * 4
    with pytest.raises(RuntimeError, match=r"rank 1 has \(6,\)"):
        hvd.allreduce(torch.ones(6 if r == 1 else 4), name="cached", op=hvd.Sum)
    assert hvd.allreduce(torch.ones(4), name="cached", op=hvd.Sum).tolist() == [float(n)] * 4


def test_duplicate_in_flight_name_is_value_error(hvd: ModuleType) -> None:
    """Each rank resubmits a name while it is surely in flight: half the ranks start with "dup.a", the other
    half with "dup.b", and each submits the other name only after a barrier that follows every rank's check,
    so neither name can complete before the checks (with one name, a fast engine may finish it first)."""
    n, r = hvd.size(), hvd.rank()
    first, second = ("dup.a", "dup.b") if r % 2 == 0 else ("dup.b", "dup.a")
    h = hvd.allreduce_async(torch.ones(2), name=first, op=hvd.Sum)
    with pytest.raises(ValueError, match="already in flight"):
        hvd.allreduce_async(torch.ones(2), name=first)
    hvd.barrier()
    h2 = hvd.allreduce_async(torch.ones(2), name=second, op=hvd.Sum)
    assert hvd.synchronize(h).tolist() == hvd.synchronize(h2).tolist() == [float(n)] * 2


def test_synchronous_value_errors(hvd: ModuleType) -> None:
    n = hvd.size()
    x = torch.arange(n * 2, dtype=torch.float32)
    with pytest.raises(ValueError, match="one per rank"):
        hvd.alltoall(x, splits=[1] * (n + 1))
    with pytest.raises(ValueError, match="sum to"):
        hvd.alltoall(x, splits=[1] * n)
    with pytest.raises(ValueError, match="int32"):
        hvd.alltoall(x, splits=torch.tensor([2] * n, dtype=torch.int64))
    with pytest.raises(ValueError, match="negative"):
        hvd.alltoall(x, splits=[-1, *([0] * (n - 2)), 2 * n + 1])
    with pytest.raises(ValueError, match="divisible"):
        hvd.alltoall(torch.ones(n + 1))
    with pytest.raises(hvd.HorovodInternalError, match=re.escape("Average or hvd.Sum")):
        hvd.reducescatter(x, op=hvd.Max)  # Horovod: refused at enqueue, a RuntimeError
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.reducescatter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="Adasum does not reduce 'int32'"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(x, root_rank=n)
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Sum)


def test_every_op_names_the_argument_it_cannot_take(hvd: ModuleType) -> None:
    """A non-tensor, or a sparse tensor where dense ones go, is refused on the calling rank, before anything
    is submitted: the message names the op, the argument and what it takes (no `empty_like()` TypeError)."""
    n = hvd.size()
    sparse = torch.eye(2).to_sparse()
    single = {
        "allreduce": (hvd.allreduce, hvd.allreduce_, hvd.allreduce_async, hvd.allreduce_async_),
        "allgather": (hvd.allgather, hvd.allgather_async),
        "broadcast": tuple(
            lambda t, f=f: f(t, 0)
            for f in (hvd.broadcast, hvd.broadcast_, hvd.broadcast_async, hvd.broadcast_async_)
        ),
        "alltoall": (hvd.alltoall, hvd.alltoall_async),
        "reducescatter": (hvd.reducescatter, hvd.reducescatter_async),
    }
    grouped = {
        "grouped_allreduce": (
            hvd.grouped_allreduce,
            hvd.grouped_allreduce_,
            hvd.grouped_allreduce_async,
            hvd.grouped_allreduce_async_,
        ),
        "grouped_allgather": (hvd.grouped_allgather, hvd.grouped_allgather_async),
        "grouped_reducescatter": (hvd.grouped_reducescatter, hvd.grouped_reducescatter_async),
    }
    for what, ops in single.items():
        for op in ops:
            for bad, kind in ((3, "int"), (None, "NoneType"), ([1.0], "list")):
                with pytest.raises(ArgumentError) as info:
                    op(bad)
                assert str(info.value) == f"{what}: argument 'tensor' must be a torch.Tensor, got {kind}"
                assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
            with pytest.raises(
                TypeError,
                match=rf"^{what}: argument 'tensor' has layout sparse_coo; {what} takes "
                r"dense \(strided\) tensors",
            ):
                op(sparse)
    for what, ops in grouped.items():
        for op in ops:
            with pytest.raises(
                TypeError, match=rf"^{what}: argument 'tensors\[1\]' must be a torch.Tensor, got str"
            ):
                op([torch.ones(n), "x"])
            with pytest.raises(TypeError, match=rf"^{what}: argument 'tensors\[0\]' has layout sparse_coo"):
                op([sparse])
            with pytest.raises(TypeError, match=rf"^{what}: argument 'tensors' must be a list or tuple"):
                op(torch.ones(n))
    with pytest.raises(
        ArgumentError, match=r"^sparse_allreduce_async: argument 'tensor' must be a sparse COO"
    ):
        hvd.sparse_allreduce_async(3, name="int", op=hvd.Sum)
    with pytest.raises(
        ArgumentError, match=r"'tensor' has layout strided; sparse_allreduce_async takes sparse_coo"
    ):
        hvd.sparse_allreduce_async(torch.ones(2), name="dense", op=hvd.Sum)
    with pytest.raises(ArgumentError, match=r"for sparse gradients: sparse_allreduce_async or Distributed"):
        hvd.allreduce(sparse)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # nothing was submitted: the engine is fine
