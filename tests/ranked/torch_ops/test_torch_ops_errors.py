"""Error contracts: cross-rank mismatches raise on every rank (naming ranks and values), never hang;
what Horovod raises synchronously stays synchronous."""

from __future__ import annotations

import re
from types import ModuleType

import pytest
import torch


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
