"""Results of every `hpcring.torch` collective, computed independently from rank and size."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def ranks_sum(n: int) -> int:
    return n * (n - 1) // 2


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_allreduce_sum_every_dtype(hvd: ModuleType, dtype: torch.dtype) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((3, 5), r + 1).to(dtype)
    y = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{dtype}")
    assert y.dtype == dtype and y.shape == (3, 5)
    assert torch.equal(y, torch.full((3, 5), n * (n + 1) // 2).to(dtype))
    assert torch.equal(x, torch.full((3, 5), r + 1).to(dtype)), "input must not be modified"


def test_allreduce_average_is_default_and_divides_by_size(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    y = hvd.allreduce(torch.full((4,), float(r)))
    assert torch.allclose(y, torch.full((4,), ranks_sum(n) / n))
    ints = hvd.allreduce(torch.full((2,), 2 * r + 1, dtype=torch.int32))  # Average of ints truncates
    assert ints.tolist() == [int(n * n / n)] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_large_out_of_place_allreduce_leaves_its_input(hvd: ModuleType, dtype: torch.dtype) -> None:
    """From 1 MiB an out-of-place allreduce copies its input into the new output and reduces there (and
    from 4 MiB the output asks for huge pages): the input must stay as it was, scale factors apply once."""
    n, r = hvd.size(), hvd.rank()
    count = (5 << 20) // torch.tensor([], dtype=dtype).element_size() + 3  # odd: splits unevenly
    x = torch.full((count,), r + 1).to(dtype)
    y = hvd.allreduce(x, op=hvd.Sum, name=f"large.{dtype}", prescale_factor=2.0)
    assert torch.equal(x, torch.full((count,), r + 1).to(dtype)), "input must not be modified"
    assert torch.equal(y, torch.full((count,), n * (n + 1)).to(dtype))
    if not dtype.is_floating_point:
        return
    z = hvd.allreduce(x.reshape(-1, 1)[: count // 2 * 2].reshape(2, -1), name=f"large.avg.{dtype}")
    assert z.shape == (2, count // 2)
    torch.testing.assert_close(z.float(), torch.full((2, count // 2), (n + 1) / 2), atol=1e-2, rtol=0)


def test_allreduce_min_max_product(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.tensor([r + 1.0, -(r + 1.0)])
    assert hvd.allreduce(x, op=hvd.Min).tolist() == [1.0, -float(n)]
    assert hvd.allreduce(x, op=hvd.Max).tolist() == [float(n), -1.0]
    prod = 1.0
    for q in range(n):
        prod *= q + 1.0
    assert hvd.allreduce(x[:1], op=hvd.Product).tolist() == [prod]


def test_allreduce_scale_factors(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    y = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.allclose(y, torch.full((3,), n * (n + 1) / 2))
    y = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Average, postscale_factor=3.0)
    assert torch.allclose(y, torch.full((3,), 3.0 * (n + 1) / 2))


def test_deprecated_average_keyword(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((2,), float(r))
    with pytest.warns(DeprecationWarning):
        assert torch.allclose(hvd.allreduce(x, average=False), torch.full((2,), float(ranks_sum(n))))
    with pytest.warns(DeprecationWarning):
        assert torch.allclose(hvd.allreduce(x, average=True), torch.full((2,), ranks_sum(n) / n))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_allreduce_in_place_async_poll_synchronize(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((6,), float(r))
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="inplace")
    out = hvd.synchronize(h)
    assert out is x and x.tolist() == [float(ranks_sum(n))] * 6
    h = hvd.allreduce_async(torch.ones(2), name="p")
    assert hvd.poll(h) in (True, False)
    hvd.synchronize(h)
    y = torch.full((2, 2), float(r))
    assert hvd.allreduce_(y, op=hvd.Max) is y and y.max().item() == n - 1
    h = hvd.allreduce_async(torch.ones(2), name="p2", op=hvd.Sum)
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h).tolist() == [float(n)] * 2
    assert hvd.synchronize(h) is None, "a synchronized handle is forgotten, as in Horovod"


def test_non_contiguous_and_legacy_tensor_types(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    y = hvd.allreduce(view, op=hvd.Sum)
    assert torch.equal(y, (torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * n + ranks_sum(n)))
    hvd.allreduce_(view, op=hvd.Sum)  # in place through the staged copy
    assert torch.equal(view, y)
    for legacy in (
        torch.IntTensor,
        torch.LongTensor,
        torch.FloatTensor,
        torch.DoubleTensor,
        torch.ByteTensor,
    ):
        t = legacy(4).fill_(r + 1)
        out = hvd.allreduce(t, op=hvd.Sum)
        assert out.type() == t.type() and out.tolist() == [n * (n + 1) // 2] * 4


def test_float16_on_cpu(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((1000,), 0.5 + r, dtype=torch.float16)
    y = hvd.allreduce(x, op=hvd.Average)
    assert y.dtype == torch.float16
    assert torch.allclose(y.float(), torch.full((1000,), 0.5 + ranks_sum(n) / n), atol=1e-2)
    b = hvd.allreduce(torch.full((8,), 1.5, dtype=torch.bfloat16), op=hvd.Sum)
    assert b.dtype == torch.bfloat16 and b.float().tolist() == [1.5 * n] * 8


def test_grouped_allreduce(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    xs = [torch.full((i + 1,), float(r + i)) for i in range(5)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    for i, y in enumerate(ys):
        assert y.tolist() == [float(ranks_sum(n) + n * i)] * (i + 1)
    hvd.grouped_allreduce_(xs, op=hvd.Sum, name="g_inplace")
    assert [x.tolist() for x in xs] == [y.tolist() for y in ys]
    h = hvd.grouped_allreduce_async([torch.ones(3), torch.ones(2, dtype=torch.float64)], name="mixed")
    a, b = hvd.synchronize(h)
    assert a.tolist() == [1.0] * 3 and b.dtype == torch.float64


def test_many_fused_requests_complete(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    for step in range(3):  # the second and third steps go through the response cache
        handles = [
            hvd.allreduce_async(torch.full((64,), float(r * i + step)), name=f"fuse.{i}", op=hvd.Sum)
            for i in range(40)
        ]
        for i, h in enumerate(handles):
            assert hvd.synchronize(h)[0].item() == ranks_sum(n) * i + n * step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_allgather_uneven(hvd: ModuleType, dtype: torch.dtype) -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.full((r + 1, 2), r).to(dtype)
    y = hvd.allgather(x, name=f"ag.{dtype}")
    want = torch.cat([torch.full((q + 1, 2), q).to(dtype) for q in range(n)])
    assert y.dtype == dtype and torch.equal(y, want)


def test_grouped_allgather_and_async(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    a, b = hvd.grouped_allgather([torch.tensor([r]), torch.full((2, 3), float(r))])
    assert a.tolist() == list(range(n)) and b.shape == (2 * n, 3)
    h = hvd.allgather_async(torch.tensor([[r, r]]))
    assert hvd.synchronize(h).tolist() == [[q, q] for q in range(n)]


def test_broadcast_every_root(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        x = torch.full((2, 3), float(r))
        y = hvd.broadcast(x, root_rank=root)
        assert torch.equal(y, torch.full((2, 3), float(root))) and x[0, 0].item() == r
        z = torch.full((4,), r, dtype=torch.int32)
        assert hvd.broadcast_(z, root) is z and z.tolist() == [root] * 4
        h = hvd.broadcast_async(torch.tensor([float(r)]), root, name=f"bcast.async.{root}")
        assert hvd.synchronize(h).item() == root


def test_alltoall_with_and_without_splits(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    # rank r sends (j + 1) rows of value 100*r + j to rank j
    splits = [j + 1 for j in range(n)]
    rows = torch.cat([torch.full((j + 1, 2), 100.0 * r + j) for j in range(n)])
    out, received = hvd.alltoall(rows, splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [r + 1] * n
    assert torch.equal(out, torch.cat([torch.full((r + 1, 2), 100.0 * q + r) for q in range(n)]))
    same = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * r)
    assert same.tolist() == [10.0 * q + r for q in range(n)]
    out2, rec2 = hvd.synchronize(hvd.alltoall_async(rows, splits=torch.tensor(splits, dtype=torch.int32)))
    assert torch.equal(out2, out) and rec2.tolist() == received.tolist()


def test_reducescatter(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # uneven: rank 0 gets one extra row
    x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + r
    mine = rows // n + (1 if r < rows % n else 0)
    start = r * (rows // n) + min(r, rows % n)
    full = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    y = hvd.reducescatter(x, op=hvd.Sum)
    assert y.shape == (mine, 3)
    assert torch.equal(y, full[start : start + mine] * n + ranks_sum(n))
    avg = hvd.reducescatter(x)  # Average is Horovod's default for reducescatter
    assert torch.allclose(avg, (full[start : start + mine] * n + ranks_sum(n)) / n)
    scaled = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    assert torch.allclose(scaled, y * 0.5)
    a, b = hvd.grouped_reducescatter([x, x.double()], op=hvd.Sum)
    assert torch.equal(a, y) and b.dtype == torch.float64


def test_barrier_and_sparse_allreduce(hvd: ModuleType) -> None:
    n, r = hvd.size(), hvd.rank()
    hvd.barrier()
    i = torch.tensor([[r, (r + 1) % n]])
    v = torch.tensor([1.0, 2.0])
    sp = torch.sparse_coo_tensor(i, v, (n,))
    handle = hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Sum)
    dense = hvd.synchronize(handle).to_dense()
    assert torch.allclose(dense, torch.full((n,), 3.0))


def test_grouped_results_have_horovods_types(hvd: ModuleType) -> None:
    """Horovod returns a tuple from synchronize() of a grouped handle, from grouped_allreduce_ and from
    grouped_allgather (autograd's result), and a list from grouped_allreduce and grouped_reducescatter."""
    n = hvd.size()
    a, b = torch.ones(3), torch.ones(2, dtype=torch.float64)
    inplace = hvd.grouped_allreduce_([a, b], op=hvd.Sum)
    assert type(inplace) is tuple and inplace[0] is a and inplace[1] is b
    assert a.tolist() == [float(n)] * 3
    synced = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(3), torch.ones(2)], op=hvd.Sum))
    assert type(synced) is tuple and [t.tolist() for t in synced] == [[float(n)] * 3, [float(n)] * 2]
    gathered = hvd.grouped_allgather([torch.ones(1), torch.ones(2, 2)])
    assert type(gathered) is tuple and gathered[0].shape == (n,) and gathered[1].shape == (2 * n, 2)
    assert type(hvd.grouped_allreduce([torch.ones(3)])) is list
    assert type(hvd.grouped_reducescatter([torch.ones(n)], op=hvd.Sum)) is list


def test_one_submit_path_views_plain_tensors_and_converts_the_rest(hvd: ModuleType) -> None:
    """The allreduce submit path hands the engine a dense contiguous CPU tensor of a plain dtype as it is (a
    zero-copy numpy view: `host_array`), in place and into a fresh output; everything else goes through
    `_view` (a contiguous copy, the bfloat16 view, a detached tensor) and gives the same results, or words
    the error."""
    from hpcring.torch.tensors import host_array

    n, r = hvd.size(), hvd.rank()
    x = torch.full((4, 3), float(r + 1))
    view = host_array(x)
    assert view is not None and view.ctypes.data == x.data_ptr()
    hvd.allreduce_(x, op=hvd.Sum, name="host.in_place")
    assert torch.equal(x, torch.full((4, 3), float(n * (n + 1) // 2)))
    src = torch.full((5,), float(r))
    out = hvd.allreduce(src, op=hvd.Average, prescale_factor=2.0)  # unnamed: the counter agrees
    assert torch.allclose(out, torch.full((5,), 2.0 * ranks_sum(n) / n))
    assert torch.equal(src, torch.full((5,), float(r)))
    converted = {
        "not contiguous": torch.full((3, 4), float(r)).t(),
        "bool": torch.full((4,), r % 2 == 0),
        "bfloat16": torch.full((4,), float(r), dtype=torch.bfloat16),
        "requires grad": torch.full((4,), float(r), requires_grad=True),
        "a Tensor subclass": torch.nn.Parameter(torch.full((4,), float(r))),
    }
    for why, t in converted.items():
        assert host_array(t) is None, why
        want = (
            torch.full(t.shape, float(n - 1)).to(t.dtype)
            if t.dtype is not torch.bool
            else torch.ones(4, dtype=torch.bool)
        )
        assert torch.equal(hvd.allreduce(t, op=hvd.Max, name=f"general.{why}").detach(), want), why
    y = torch.ones(2)
    assert torch.equal(hvd.allreduce(y, op=hvd.Sum, prescale_factor=2), torch.full((2,), 2.0 * n))  # an int
    unregistered = hvd.ProcessSet([0])
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(y, process_set=unregistered)
