"""Fused allreduces of tensors that are views of one buffer: reduced where they lie (no pack, no unpack) when
they are adjacent, through the fusion buffer otherwise, with the same results either way (numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hpcring.collective.topology import Topology
from hpcring.engine import Engine, OpType, Request, Signature
from hpcring.errors import CollectiveError

SHAPES: list[tuple[int, ...]] = [(7,), (3, 5), (16,), (2, 2, 3), (1,), (33,)]
GUARD = 5  # elements before and after the views, which no reduction may touch


def _views(flat: np.ndarray, shapes: Sequence[tuple[int, ...]], start: int = GUARD) -> list[np.ndarray]:
    """Back-to-back views of `flat` with the given shapes, from element `start`."""
    out, off = [], start
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[off : off + n].reshape(shape))
        off += n
    return out


def _total(shapes: Sequence[tuple[int, ...]]) -> int:
    return sum(int(np.prod(s)) for s in shapes)


def _run(
    engine: Engine,
    tag: str,
    tensors: list[np.ndarray],
    outputs: list[np.ndarray | None],
    reduce_op: str = "sum",
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> list[np.ndarray]:
    def sig(i: int, t: np.ndarray) -> Signature:
        name = f"{tag}.{i}"
        return Signature(name, OpType.ALLREDUCE, t.dtype.name, t.shape, reduce_op, -1, prescale, postscale)

    reqs = [Request(sig(i, t), 0, t, o) for i, (t, o) in enumerate(zip(tensors, outputs, strict=True))]
    engine.submit_many(reqs)
    return [r.handle.wait() for r in reqs]


def _expected_sum(n: int, base: np.ndarray) -> np.ndarray:
    """sum over ranks r of (base + r)."""
    return n * base + n * (n - 1) / 2


def _counters(engine: Engine) -> tuple[int, int]:
    return engine.stats["no_pack"], engine.stats["no_unpack"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_in_place_adjacent_views_reduce_where_they_lie(engine: Engine, world: Topology, dtype: str) -> None:
    n, r = world.size, world.rank
    total = _total(SHAPES)
    base = np.arange(total + 2 * GUARD, dtype=dtype)
    flat = base + r
    views = _views(flat, SHAPES)
    before = _counters(engine)
    results = _run(engine, f"inplace.{dtype}", views, list(views))
    assert _counters(engine) == (before[0] + 1, before[1] + 1), "one batch, neither packed nor unpacked"
    want = _expected_sum(n, base)
    np.testing.assert_array_equal(flat[GUARD : GUARD + total], want[GUARD : GUARD + total])
    np.testing.assert_array_equal(flat[:GUARD], base[:GUARD] + r, "memory before the views untouched")
    np.testing.assert_array_equal(flat[GUARD + total :], base[GUARD + total :] + r, "and after them")
    for res, view in zip(results, views, strict=True):
        assert res is view


def test_out_of_place_adjacent_views(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    total = _total(SHAPES)
    base = np.linspace(-3.0, 3.0, total + 2 * GUARD)
    src_flat = base + r
    dst_flat = np.full_like(base, -7.0)
    before = _counters(engine)
    results = _run(engine, "outofplace", _views(src_flat, SHAPES), list(_views(dst_flat, SHAPES)))
    assert _counters(engine) == (before[0] + 1, before[1] + 1)
    np.testing.assert_allclose(dst_flat[GUARD : GUARD + total], _expected_sum(n, base)[GUARD : GUARD + total])
    np.testing.assert_array_equal(src_flat, base + r, "inputs unchanged")
    assert (dst_flat[:GUARD] == -7.0).all() and (dst_flat[GUARD + total :] == -7.0).all()
    assert all(res.base is not None for res in results)


@pytest.mark.parametrize("side", ["inputs", "outputs"])
def test_one_side_adjacent(engine: Engine, world: Topology, side: str) -> None:
    """Adjacent inputs with separate outputs skip the pack only; separate inputs with adjacent outputs skip
    the unpack only."""
    n, r = world.size, world.rank
    total = _total(SHAPES)
    base = np.arange(total + 2 * GUARD, dtype=np.float64)
    flat = base + r if side == "inputs" else np.zeros_like(base)
    adjacent = _views(flat, SHAPES)
    separate = [np.zeros(s) for s in SHAPES]
    if side == "inputs":
        tensors, outputs = adjacent, separate
    else:
        tensors = [v.copy() for v in _views(base + r, SHAPES)]  # separate arrays
        outputs = adjacent
    before = _counters(engine)
    results = _run(engine, f"oneside.{side}", tensors, list(outputs))
    after = _counters(engine)
    skipped = ((1, 0) if side == "inputs" else (0, 1)) if n > 1 else (0, 0)  # one rank: one copy, no reduce
    assert (after[0] - before[0], after[1] - before[1]) == skipped
    got = np.concatenate([res.reshape(-1) for res in results])
    np.testing.assert_array_equal(got, _expected_sum(n, base)[GUARD : GUARD + total])


def test_average_with_scale_factors_on_adjacent_views(engine: Engine, world: Topology) -> None:
    n, r = world.size, world.rank
    total = _total(SHAPES)
    base = np.arange(total + 2 * GUARD, dtype=np.float64)
    flat = base + r
    views = _views(flat, SHAPES)
    _run(engine, "avg", views, list(views), reduce_op="average", prescale=2.0, postscale=0.5)
    want = (2.0 * _expected_sum(n, base) / n) * 0.5
    np.testing.assert_allclose(flat[GUARD : GUARD + total], want[GUARD : GUARD + total])
    np.testing.assert_array_equal(flat[:GUARD], base[:GUARD] + r)


def test_views_that_are_not_adjacent_go_through_the_fusion_buffer(engine: Engine, world: Topology) -> None:
    """Reversed order, a gap, a strided view and partially overlapping outputs: packed and unpacked, and
    still the same results (every input is read before any output is written)."""
    n, r = world.size, world.rank
    total = _total(SHAPES)
    base = np.arange(total + 2 * GUARD, dtype=np.float64)
    want = _expected_sum(n, base)
    cases: dict[str, tuple[list[np.ndarray], list[np.ndarray | None], np.ndarray]] = {}
    flat = base + r
    views = _views(flat, SHAPES)
    cases["reversed"] = (views[::-1], list(views[::-1]), flat)
    flat2 = base + r
    gap = [flat2[GUARD : GUARD + 4], flat2[GUARD + 5 : GUARD + 9]]
    cases["gap"] = (gap, list(gap), flat2)
    flat3 = base + r
    strided = [flat3[0:10:2], flat3[10:20:2]]
    cases["strided"] = (strided, list(strided), flat3)
    before = _counters(engine)
    for tag, (tensors, outputs, _) in cases.items():
        _run(engine, f"notadjacent.{tag}", tensors, outputs)
    assert _counters(engine) == before
    np.testing.assert_array_equal(flat[GUARD : GUARD + total], want[GUARD : GUARD + total])
    np.testing.assert_array_equal(flat2[GUARD : GUARD + 4], want[GUARD : GUARD + 4])
    np.testing.assert_array_equal(flat2[GUARD + 4], base[GUARD + 4] + r, "the gap is untouched")
    np.testing.assert_array_equal(flat2[GUARD + 5 : GUARD + 9], want[GUARD + 5 : GUARD + 9])
    np.testing.assert_array_equal(flat3[0:20:2], want[0:20:2])
    np.testing.assert_array_equal(flat3[1:20:2], base[1:20:2] + r)

    # Outputs shifted by one tensor over the inputs: overlapping, not the same memory.
    same = [(8,)] * 4
    flat4 = np.arange(8 * 5, dtype=np.float64) + r
    ins = _views(flat4, same, start=0)[:4]
    outs = _views(flat4, same, start=8)[:4]
    expected = [_expected_sum(n, np.arange(8 * 5, dtype=np.float64))[8 * i : 8 * i + 8] for i in range(4)]
    before = _counters(engine)
    _run(engine, "shifted", ins, list(outs))
    assert _counters(engine) == before
    for i in range(4):
        np.testing.assert_array_equal(flat4[8 * (i + 1) : 8 * (i + 2)], expected[i])


def test_read_only_views_are_never_written_in_place(engine: Engine, world: Topology) -> None:
    """In place over read-only memory: refused as before (the unpack raises on every rank), never written
    behind numpy's back by the collective."""
    if world.size == 1:
        pytest.skip("one rank: an in-place result is its input, so nothing is written and nothing refused")
    r = world.rank
    flat = np.arange(_total(SHAPES) + 2 * GUARD, dtype=np.float64) + r
    flat.flags.writeable = False
    views = _views(flat, SHAPES)
    with pytest.raises(CollectiveError, match="read-only"):
        _run(engine, "readonly", views, [None] * len(views))
    np.testing.assert_array_equal(flat, np.arange(flat.size, dtype=np.float64) + r)
