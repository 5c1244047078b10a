"""op=hvd.Adasum in allreduce, its variants and grouped_allreduce, against the NumPy reference of the same
tree (adasum_reference.py), on the route the launch gives CPU tensors: the host plane (flat Adasum over
MPI), the MPI route's stand-in (staged, flat) or the process-group route's (gloo for NCCL: Horovod's GPU
form, a sum inside each node and Adasum across nodes)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch
from adasum_cases import DEVICE, dev, expected, host, node_aware, tolerance, vectors
from adasum_reference import adasum

DTYPES = [np.float32, np.float64, np.float16]


@pytest.fixture(autouse=True)
def _power_of_two(hvd: ModuleType) -> None:
    n = hvd.size()
    if n & (n - 1):
        pytest.skip("Adasum is refused at this world size (test_adasum_ranks.py)")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_single_tensor_every_variant(hvd: ModuleType, dtype: type) -> None:
    r, n = hvd.rank(), hvd.size()
    want = expected(hvd, [vectors(q, dtype, (301,)) for q in range(n)])[0]
    mine = vectors(r, dtype, (301,))[0]
    t = dev(mine.copy())
    out = hvd.allreduce(t, op=hvd.Adasum, name="single")
    np.testing.assert_allclose(host(out), want, **tolerance(dtype))
    assert np.array_equal(host(t), mine)  # the input is left alone
    hvd.allreduce_(t, op=hvd.Adasum, name="single_")
    np.testing.assert_allclose(host(t), want, **tolerance(dtype))
    t2 = dev(mine.copy())
    h = hvd.allreduce_async_(t2, op=hvd.Adasum, name="async_")
    assert hvd.synchronize(h) is t2
    np.testing.assert_allclose(host(t2), want, **tolerance(dtype))
    t3 = dev(mine.copy()).reshape(7, 43)
    out3 = hvd.synchronize(hvd.allreduce_async(t3, op=hvd.Adasum, name="async"))
    assert out3.shape == (7, 43)
    np.testing.assert_allclose(host(out3.reshape(-1)), want, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_fused_tensors_keep_their_own_dot_products(hvd: ModuleType, dtype: type) -> None:
    """A group is one fused batch: each tensor must still be combined with its own dot product and norms,
    which gives another result than Adasum over the concatenated buffer."""
    r, n = hvd.rank(), hvd.size()
    every = [vectors(q, dtype, seed=1) for q in range(n)]
    want = expected(hvd, every)
    out = hvd.grouped_allreduce([dev(v) for v in vectors(r, dtype, seed=1)], op=hvd.Adasum)
    for got, w in zip(out, want, strict=True):
        np.testing.assert_allclose(host(got), w, **tolerance(dtype))
    if n > 1 and not node_aware():
        whole = adasum([[np.concatenate(v)] for v in every])[0]
        assert not np.allclose(np.concatenate([host(o) for o in out]), whole, rtol=1e-3)


def test_async_requests_fuse_and_match(hvd: ModuleType) -> None:
    """Separate async requests queued together land in fused batches and still match per tensor."""
    from hpcring.torch import basics

    r, n = hvd.rank(), hvd.size()
    want = expected(hvd, [vectors(q, np.float32, seed=2) for q in range(n)])
    engine = basics.engine()
    fused = engine.stats["fused"]
    with engine.deferred_wake():  # queued before the engine thread looks: one cycle sees them all
        handles = [
            hvd.allreduce_async(dev(v), op=hvd.Adasum, name=f"fuse.{i}")
            for i, v in enumerate(vectors(r, np.float32, seed=2))
        ]
    engine.wake()
    for h, w in zip(handles, want, strict=True):
        np.testing.assert_allclose(host(hvd.synchronize(h)), w, **tolerance(np.float32))
    assert engine.stats["fused"] > fused


def test_grouped_in_place_with_scale_factors(hvd: ModuleType) -> None:
    r, n = hvd.rank(), hvd.size()
    want = expected(hvd, [[3.0 * v for v in vectors(q, np.float64, seed=3)] for q in range(n)])
    ts = [dev(v) for v in vectors(r, np.float64, seed=3)]
    out = hvd.grouped_allreduce_(ts, op=hvd.Adasum, prescale_factor=3.0, postscale_factor=0.5)
    for got, t, w in zip(out, ts, want, strict=True):
        assert got is t
        np.testing.assert_allclose(host(t), 0.5 * w, **tolerance(np.float64))


def test_orthogonal_vectors_sum_and_parallel_vectors_average(hvd: ModuleType) -> None:
    """Adasum's two defining cases (Horovod's own tests): orthogonal vectors add up, parallel ones average
    (across nodes, on the node-aware route, of the nodes' averages)."""
    r, n = hvd.rank(), hvd.size()
    q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((64, n)))
    got = host(hvd.allreduce(dev(q[:, r].copy()), op=hvd.Adasum, name="orthogonal"))
    divisor = hvd.local_size() if node_aware() else 1
    np.testing.assert_allclose(got, q.sum(axis=1) / divisor, rtol=1e-10, atol=1e-12)
    base = np.random.default_rng(6).standard_normal(64)
    scales = 1.0 + np.arange(n)
    got = host(hvd.allreduce(dev(base * scales[r]), op=hvd.Adasum, name="parallel"))
    np.testing.assert_allclose(got, base * scales.mean(), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_tiny_magnitudes_stay_stable(hvd: ModuleType, dtype: type) -> None:
    """Horovod's stability test: parallel vectors at the dtype's smallest normal magnitude still average,
    because dot products and norms are float64."""
    r, n = hvd.rank(), hvd.size()
    a = np.random.default_rng(7).standard_normal(1024) * np.finfo(dtype).tiny
    coef = np.random.default_rng(8).standard_normal(n)
    q = np.outer(a, coef).astype(dtype).astype(np.float64)
    got = hvd.allreduce(dev(q[:, r].astype(dtype)), op=hvd.Adasum, name=f"tiny.{dtype}")
    want = q.sum(axis=1) / n
    assert np.linalg.norm(want - host(got)) / np.linalg.norm(want) / 100 < np.finfo(dtype).eps


def test_a_zero_vector_is_neutral(hvd: ModuleType) -> None:
    """A rank with nothing to add (zeros, as a joined rank contributes) leaves the others' Adasum."""
    r, n = hvd.rank(), hvd.size()
    every = [vectors(q, np.float64, (33,)) for q in range(n)]
    every[0] = [np.zeros(33)]
    got = host(hvd.allreduce(dev(every[r][0]), op=hvd.Adasum, name="zero"))
    np.testing.assert_allclose(got, expected(hvd, every)[0], **tolerance(np.float64))


def test_refused_dtypes_and_ops_name_what_is_allowed(hvd: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"does not reduce 'int64' tensors; allowed: 'float16'"):
        hvd.allreduce(dev(np.ones(3, dtype=np.int64)), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="bfloat16"):  # Horovod's exception type, too
        hvd.allreduce(torch.ones(3, dtype=torch.bfloat16, device=DEVICE), op=hvd.Adasum)
    with pytest.raises(hvd.HorovodInternalError, match=r"Average or hvd\.Sum"):
        hvd.reducescatter(torch.ones(4), op=hvd.Adasum)


def test_small_message_chunks_give_the_same_result(hvd: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOROVOD_ADASUM_MPI_CHUNK_SIZE splits every exchange into messages of at most that many bytes (set
    alike on every rank, as the engine requires)."""
    monkeypatch.setenv("HOROVOD_ADASUM_MPI_CHUNK_SIZE", "40")
    r, n = hvd.rank(), hvd.size()
    want = expected(hvd, [vectors(q, np.float32, seed=9) for q in range(n)])
    out = hvd.grouped_allreduce([dev(v) for v in vectors(r, np.float32, seed=9)], op=hvd.Adasum)
    for got, w in zip(out, want, strict=True):
        np.testing.assert_allclose(host(got), w, **tolerance(np.float32))


def test_joined_ranks_contribute_zeros(hvd: ModuleType) -> None:
    """Rank r has r + 1 steps: at step s the ranks below s have joined and add zeros, which Adasum leaves
    out (a zero vector's coefficient is 1 and it adds nothing)."""
    r, n = hvd.rank(), hvd.size()
    for s in range(r + 1):
        every = [vectors(q, np.float64, (40, 9), seed=20 + s) for q in range(n)]
        for q in range(min(s, n)):
            every[q] = [np.zeros_like(v) for v in every[q]]
        out = hvd.grouped_allreduce([dev(v) for v in every[r]], op=hvd.Adasum, name="join.ada")
        for got, w in zip(out, expected(hvd, every), strict=True):
            np.testing.assert_allclose(host(got), w, **tolerance(np.float64))
    assert hvd.join() == n - 1


def test_gradient_is_the_adasum_of_the_gradients(hvd: ModuleType) -> None:
    """As Horovod's autograd function: the backward pass reduces the gradient with the same op (every rank's
    gradient is ones: parallel vectors, so their Adasum is ones again; the node-aware route averages too)."""
    x = dev(vectors(hvd.rank(), np.float64, (12,))[0]).requires_grad_()
    hvd.allreduce(x, op=hvd.Adasum, name="grad").sum().backward()
    assert x.grad is not None
    assert np.allclose(host(x.grad), np.ones(12))


def test_process_sets_other_than_the_global_one_are_refused(hvd: ModuleType) -> None:
    n = hvd.size()
    if n == 1:
        pytest.skip("needs a set smaller than the world")
    ps = hvd.add_process_set([0])
    try:
        if hvd.rank() == 0:
            with pytest.raises(NotImplementedError, match="global process set only"):
                hvd.allreduce(torch.ones(3), op=hvd.Adasum, process_set=ps)
    finally:
        hvd.remove_process_set(ps)
