"""allreduce on every rank: every dtype x op x algorithm, in and out of place, uneven/empty sizes, scaling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from collective_cases import ALGORITHMS, ALL_DTYPES, NUMERIC, expected_reduce, gen, np_dtype

import hpcring
from hpcring.collective import ReduceOp, Topology
from hpcring.errors import ConfigError

INTEGERS = ("uint8", "int8", "int16", "int32", "int64")
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}


def ops_for(name: str) -> list[ReduceOp]:
    return [ReduceOp.MIN, ReduceOp.MAX] if name == "bool" else list(ReduceOp)


def check(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], name: str, exact: bool, label: str) -> None:
    assert got.dtype == np_dtype(name), label
    g = got.astype(np.float64).reshape(-1)
    if exact or name not in TOLERANCE:
        np.testing.assert_array_equal(g, want.astype(np_dtype(name)).astype(np.float64), err_msg=label)
    else:
        np.testing.assert_allclose(g, want, rtol=TOLERANCE[name], err_msg=label)


def cases(name: str) -> list[tuple[ReduceOp, int, bool]]:
    """(op, count, in place): every op at an uneven size both ways; the tiny and empty sizes with SUM only
    (kept few: each case is two collectives on oversubscribed cores)."""
    out = [(op, 1031, False) for op in ops_for(name)] + [(op, 7, True) for op in ops_for(name)]
    first = ops_for(name)[0]
    return [*out, (first, 0, False), (first, 0, True), (first, 1, False)]


def reduce_and_check(
    world: Topology, count: int, name: str, op: ReduceOp, algorithm: str, in_place: bool, label: str
) -> None:
    """Allreduce this rank's `gen` input with `algorithm`, in place or not, and check the result against the
    reduction of every rank's input (and, out of place, that the input is unchanged)."""
    want = expected_reduce(world.size, count, name, op)
    x = gen(world.rank, count, name, op)
    exact = op is not ReduceOp.AVERAGE
    if in_place:
        assert hpcring.allreduce(x, op, out=x, algorithm=algorithm) is x
        check(x, want, name, exact, label + " in-place")
    else:
        before = x.copy()
        check(hpcring.allreduce(x, op, algorithm=algorithm), want, name, exact, label + " out-of-place")
        np.testing.assert_array_equal(x, before, err_msg=label + ": input modified")


def refused_off_node(world: Topology, algorithm: str) -> bool:
    """`shm` on a group that spans nodes: a ConfigError on every rank that says why (and nothing else to
    test); True then."""
    if algorithm != "shm" or len(world.node_sizes) == 1:
        return False
    with pytest.raises(ConfigError, match=r"'shm' needs every rank on one node.* spans 2 nodes"):
        hpcring.allreduce(np.ones(5, np.float32), algorithm="shm")
    return True


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ALL_DTYPES)
def test_every_op_and_size(world: Topology, name: str, algorithm: str) -> None:
    if refused_off_node(world, algorithm):
        return
    for op, count, in_place in cases(name):
        label = f"{name} {op.name} count={count} {algorithm}"
        reduce_and_check(world, count, name, op, algorithm, in_place, label)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", NUMERIC)
def test_prescale_and_postscale(world: Topology, name: str, algorithm: str) -> None:
    n, r, count = world.size, world.rank, 1031
    if refused_off_node(world, algorithm):
        return
    pre, post = 0.5, 3.0
    inputs = [gen(q, count, name).astype(np.float64) * pre for q in range(n)]
    if name in INTEGERS:
        inputs = [np.trunc(v) for v in inputs]
    want = np.sum(inputs, axis=0) * post
    out = np.empty(count, dtype=np_dtype(name))
    got = hpcring.allreduce(
        gen(r, count, name), out=out, prescale_factor=pre, postscale_factor=post, algorithm=algorithm
    )
    assert got is out
    check(out, want, name, True, f"{name} scaled {algorithm}")


@pytest.mark.parametrize("algorithm", ("ring", "hierarchical"))
@pytest.mark.parametrize("name", ("float32", "float16", "bfloat16", "int64"))
def test_many_pipeline_chunks(
    world: Topology, name: str, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks force dozens of pipelined messages per ring segment."""
    monkeypatch.setenv("HPCRING_RING_CHUNK_BYTES", "1000")
    count = 20_011
    for op in (ReduceOp.SUM, ReduceOp.MAX):
        y = hpcring.allreduce(gen(world.rank, count, name, op), op, algorithm=algorithm)
        check(y, expected_reduce(world.size, count, name, op), name, True, f"{name} {op.name} chunked")


def test_shape_is_kept_and_scalars_work(world: Topology) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) + world.rank
    y = hpcring.allreduce(x, ReduceOp.MAX)
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, np.arange(24).reshape(2, 3, 4) + world.size - 1)
    s = hpcring.allreduce(np.array(world.rank + 1, dtype=np.int64))
    assert s.shape == () and int(s) == world.size * (world.size + 1) // 2


def test_non_contiguous_input_in_place(world: Topology) -> None:
    base = np.zeros((6, 4), dtype=np.float64)
    view = base[:, 1]  # strided
    view[...] = np.arange(6) + world.rank
    hpcring.allreduce(view, out=view, algorithm="ring")
    np.testing.assert_array_equal(base[:, 1], np.arange(6) * world.size + world.size * (world.size - 1) / 2)
    assert (base[:, 0] == 0).all()


def test_algorithm_from_environment(world: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCRING_ALLREDUCE_ALGORITHM", "ring")
    y = hpcring.allreduce(np.ones(10, dtype=np.int32))
    assert (y == world.size).all()


@pytest.mark.parametrize("name", ("float32", "int64", "float16"))
def test_hierarchical_with_native_node_stages(
    world: Topology, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transport with `prefer_native` (as NCCL sets) gets its own reduce-scatter/allgatherv inside the node;
    exercised here over MPI. float16 has no native reduction, so it must fall back to the ring."""
    monkeypatch.setattr(world.transport("local"), "prefer_native", True, raising=False)
    for count in (0, 5, 1031):
        want = expected_reduce(world.size, count, name, ReduceOp.SUM)
        y = hpcring.allreduce(gen(world.rank, count, name), algorithm="hierarchical")
        check(y, want, name, True, f"{name} count={count} out-of-place")
        z = gen(world.rank, count, name)
        hpcring.allreduce(z, out=z, algorithm="hierarchical")
        check(z, want, name, True, f"{name} count={count} in-place")


@pytest.mark.parametrize("name", ("float32", "float16", "bfloat16", "int64", "bool"))
def test_hierarchical_pipeline_segments(world: Topology, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny pipeline segments cut an uneven buffer into dozens of segments, each going through the node
    reduce-scatter, the cross-node ring and the node allgather while other segments are in flight (on
    several nodes; one node runs the stages one after another). Every op, in place and not."""
    monkeypatch.setenv("HPCRING_HIER_SEGMENT_BYTES", "512")
    monkeypatch.setenv("HPCRING_RING_CHUNK_BYTES", "200")
    for i, op in enumerate(ops_for(name)):
        reduce_and_check(world, 5003, name, op, "hierarchical", i % 2 == 1, f"{name} {op.name} pipelined")
