"""Fused batches of separate tensors through the node's shared-memory segment: packed straight into this
rank's slot and unpacked straight from the result. Same results as the fusion-buffer path, every op, in place
and not; not taken off one node, below the size floor, with a prescale, or with another algorithm set. Large
contiguous requests (a gradient bucket) go through it too, from 2 ranks on one node."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from hpcring.collective.selection import SHM_MIN_BYTES
from hpcring.collective.topology import Topology
from hpcring.config import EngineSettings
from hpcring.engine import Engine, OpType, Request, Signature
from hpcring.engine.host_plane import ENGINE_SHM_ROUND_BYTES, SHM_FUSED_MIN_BYTES
from hpcring.errors import ConfigError

SHAPES: list[tuple[int, ...]] = [(8199,), (61, 67), (5000,), (3, 5, 7), (1,), (2048,)]  # 76 KiB float32


def _inputs(rank: int, dtype: str, scale: int = 1) -> list[np.ndarray]:
    out = []
    for i, shape in enumerate(SHAPES * scale):
        n = int(np.prod(shape))
        out.append(((np.arange(n) + i) % 7 + rank).astype(dtype).reshape(shape))
    return out


def _want(size: int, dtype: str, op: str, scale: int = 1) -> list[np.ndarray]:
    per_rank = [[a.astype(np.float64) for a in _inputs(q, dtype, scale)] for q in range(size)]
    reduce = {"sum": np.sum, "average": np.mean, "min": np.min, "max": np.max, "product": np.prod}[op]
    return [reduce(np.stack(parts), axis=0) for parts in zip(*per_rank, strict=True)]


def _run(
    engine: Engine,
    tag: str,
    tensors: list[np.ndarray],
    outputs: list[np.ndarray],
    op: str = "sum",
    pre: float = 1.0,
    post: float = 1.0,
) -> list[np.ndarray]:
    reqs = [
        Request(Signature(f"{tag}.{i}", OpType.ALLREDUCE, t.dtype.name, t.shape, op, -1, pre, post), 0, t, o)
        for i, (t, o) in enumerate(zip(tensors, outputs, strict=True))
    ]
    engine.submit_many(reqs)
    return [r.handle.wait() for r in reqs]


def _on_one_node(world: Topology) -> bool:
    return world.size > 1 and len(world.node_sizes) == 1  # not cross_size: per rank on unequal nodes


@pytest.mark.parametrize(
    ("dtype", "op"),
    [("float32", "sum"), ("float64", "average"), ("int32", "min"), ("int64", "max"), ("float16", "sum")],
)
@pytest.mark.parametrize("in_place", [False, True])
def test_every_op_through_shared_memory(
    engine: Engine, world: Topology, dtype: str, op: str, in_place: bool
) -> None:
    scale = 2 if dtype == "float16" else 1  # keep float16 batches above the size floor too
    tensors = _inputs(world.rank, dtype, scale)
    assert sum(t.nbytes for t in tensors) >= SHM_FUSED_MIN_BYTES
    outputs = tensors if in_place else [np.full_like(t, -1) for t in tensors]
    before = engine.stats["shm"]
    results = _run(engine, f"shm.{dtype}.{op}.{in_place}", tensors, outputs, op)
    assert engine.stats["shm"] == before + _on_one_node(world)
    for got, out, want in zip(results, outputs, _want(world.size, dtype, op, scale), strict=True):
        assert got is out and got.dtype == np.dtype(dtype)
        if op == "average" or dtype == "float16":
            np.testing.assert_allclose(got, want, rtol=1e-3)
        else:
            np.testing.assert_array_equal(got, want.astype(dtype))


def test_postscale_and_partial_overlap(engine: Engine, world: Topology) -> None:
    """Outputs shifted by one tensor over the inputs (every input is read before any output is written) and
    a postscale applied to each part by its owner."""
    n, r = world.size, world.rank
    count = 8192
    flat = np.arange(count * 5, dtype=np.float64) + r
    ins = [flat[count * i : count * (i + 1)] for i in range(4)]
    outs = [flat[count * (i + 1) : count * (i + 2)] for i in range(4)]
    base = np.arange(count * 5, dtype=np.float64)
    before = engine.stats["shm"]
    _run(engine, "shm.shifted", ins, outs, "sum", post=0.5)
    assert engine.stats["shm"] == before + _on_one_node(world)
    for i in range(4):
        want = (n * base[count * i : count * (i + 1)] + n * (n - 1) / 2) * 0.5
        np.testing.assert_array_equal(flat[count * (i + 1) : count * (i + 2)], want)


def test_small_batches_and_prescale_take_the_fusion_buffer(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    before = engine.stats["shm"]
    small = [np.full(100, r + i, np.float32) for i in range(4)]
    got = _run(engine, "shm.small", small, [np.empty_like(t) for t in small])
    big = _inputs(r, "float64")
    scaled = _run(engine, "shm.prescaled", big, [np.empty_like(t) for t in big], pre=2.0)
    assert engine.stats["shm"] == before
    for i, res in enumerate(got):
        assert (res == n * i + n * (n - 1) / 2).all()
    for res, want in zip(scaled, _want(n, "float64", "sum"), strict=True):
        np.testing.assert_allclose(res, 2.0 * want)


@pytest.fixture()
def ring_engine(world: Topology) -> Iterator[Engine]:
    e = Engine(world, EngineSettings(allreduce_algorithm="ring"))
    yield e
    e.shutdown()


def test_an_algorithm_set_by_the_user_is_kept(ring_engine: Engine, world: Topology) -> None:
    tensors = _inputs(world.rank, "float32")
    results = _run(ring_engine, "shm.ring", tensors, [np.empty_like(t) for t in tensors])
    assert ring_engine.stats["shm"] == 0 and ring_engine.stats["fused"] >= 1
    for got, want in zip(results, _want(world.size, "float32", "sum"), strict=True):
        np.testing.assert_array_equal(got, want)


def test_shm_set_for_a_job_across_nodes_is_refused_at_start(world: Topology) -> None:
    """HPCRING_ALLREDUCE_ALGORITHM=shm with ranks on several nodes: a ConfigError from the engine's
    constructor on every rank (before any communication), not an engine failure at the first fused batch.
    On one node the setting takes every fused batch through shared memory, whatever its size."""
    if len(world.node_sizes) == 1:
        e = Engine(world, EngineSettings(allreduce_algorithm="shm"))
        try:
            small = [np.full(100, world.rank + i, np.float32) for i in range(4)]
            got = _run(e, "shm.forced", small, [np.empty_like(t) for t in small])
            assert e.stats["shm"] == (world.size > 1)
            n = world.size
            for i, res in enumerate(got):
                assert (res == n * i + n * (n - 1) / 2).all()
        finally:
            e.shutdown()
        return
    with pytest.raises(ConfigError, match=r"=shm needs every rank on one node, but this job spans 2 nodes"):
        Engine(world, EngineSettings(allreduce_algorithm="shm"))


@pytest.mark.parametrize("in_place", [False, True])
def test_a_large_contiguous_request_goes_through_shared_memory(
    engine: Engine, world: Topology, in_place: bool
) -> None:
    """One request (a gradient bucket) of 1.5 rounds, averaged: through shared memory on one node from 2
    ranks (the engine's rule; the collective library's own `auto` waits for 4), else the ring."""
    n, r = world.size, world.rank
    count = (ENGINE_SHM_ROUND_BYTES + SHM_MIN_BYTES // 2) // 4 + 3  # a second, partial round
    x = np.arange(count, dtype=np.float32) % 1000 + r
    out = x if in_place else np.full_like(x, -1)
    before = engine.stats["shm"]
    req = Request(
        Signature(f"shm.bucket.{in_place}", OpType.ALLREDUCE, "float32", x.shape, "average"), 0, x, out
    )
    got = engine.submit(req).wait()
    assert got is out and engine.stats["shm"] == before + _on_one_node(world)
    want = np.arange(count, dtype=np.float64) % 1000 + (n - 1) / 2
    np.testing.assert_allclose(got, want, rtol=1e-6)
