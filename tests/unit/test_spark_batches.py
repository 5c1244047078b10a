"""How a rank of the TorchEstimator walks its shard (hpcring.spark.torch.remote), without Spark: slices in
order without shuffling, a seeded permutation per epoch and rank with it, wrapping round when the steps
need more rows than the shard holds; and the tensors a batch gives the model."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from hpcring.spark.common.prepare import Column  # noqa: E402
from hpcring.spark.torch.remote import TrainSpec, _batches, _order, as_tensors, tensors  # noqa: E402


def _rows(batch: object, n_rows: int) -> list[int]:
    return list(range(n_rows))[batch] if isinstance(batch, slice) else batch.tolist()


def test_without_shuffle_batches_are_slices_in_order() -> None:
    batches = list(_batches(10, 3, 3, _order(10, False, 5, 0, 0)))
    assert batches == [slice(0, 3), slice(3, 6), slice(6, 9)]


def test_steps_beyond_the_shard_wrap_round() -> None:
    batches = [_rows(b, 5) for b in _batches(5, 2, 4, None)]
    assert batches == [[0, 1], [2, 3], [4, 0], [1, 2]]


def test_shuffle_is_a_permutation_per_epoch_and_rank_fixed_by_the_seed() -> None:
    def epoch(seed: int, e: int, rank: int) -> list[int]:
        return [r for b in _batches(12, 4, 3, _order(12, True, seed, e, rank)) for r in _rows(b, 12)]

    first = epoch(7, 0, 0)
    assert sorted(first) == list(range(12)) and first != list(range(12))
    assert epoch(7, 0, 0) == first
    assert epoch(7, 1, 0) != first and epoch(7, 0, 1) != first and epoch(8, 0, 0) != first


def test_a_batch_gives_shaped_float_features_and_typed_labels() -> None:
    spec = TrainSpec(
        feature_cols=["x", "s"],
        label_cols=["cls", "y"],
        columns={
            "x": Column("x", "array", "float", 3),
            "s": Column("s", "scalar", "int", 1),
            "cls": Column("cls", "scalar", "int", 1),
            "y": Column("y", "scalar", "float", 1),
        },
        input_shapes=[[-1, 3], [-1, 1]],
        batch_size=2, val_batch_size=2, epochs=1, steps=1, val_steps=0, shuffle=False, seed=None,
        train_path="", val_path=None, checkpoint_file=None, verbose=0,
    )  # fmt: skip
    data = as_tensors(
        spec,
        {
            "x": np.arange(12, dtype=np.float64).reshape(4, 3),
            "s": np.array([1, 2, 3, 4]),
            "cls": np.array([0, 1, 1, 0]),
            "y": np.array([0.5, 1.5, 2.5, 3.5]),
        },
    )
    (x, s), (cls, y) = tensors(spec, data, torch.tensor([3, 1]))
    assert x.dtype == torch.float32 and x.tolist() == [[9, 10, 11], [3, 4, 5]]
    assert s.dtype == torch.float32 and s.tolist() == [[4], [2]]
    assert cls.dtype == torch.int64 and cls.tolist() == [0, 1]
    assert y.dtype == torch.float32 and y.tolist() == [3.5, 1.5]


def test_features_are_shaped_once_per_row_or_per_batch_and_writable() -> None:
    """An input shape [-1, *row] shapes the whole shard once (a batch is a slice); any other shape is
    applied to each batch. Either way the tensors are writable copies of pyarrow's read-only arrays."""
    spec = TrainSpec(
        feature_cols=["img", "pair"],
        label_cols=["y"],
        columns={
            "img": Column("img", "array", "float", 4),
            "pair": Column("pair", "array", "float", 4),
            "y": Column("y", "scalar", "float", 1),
        },
        input_shapes=[[-1, 1, 2, 2], [-1, 2]],
        batch_size=2, val_batch_size=2, epochs=1, steps=1, val_steps=0, shuffle=False, seed=None,
        train_path="", val_path=None, checkpoint_file=None, verbose=0,
    )  # fmt: skip
    rows = np.arange(16, dtype=np.float64).reshape(4, 4)
    rows.flags.writeable = False
    data = as_tensors(spec, {"img": rows, "pair": rows, "y": np.zeros(4)})
    assert data["img"].shape == (4, 1, 2, 2) and data["pair"].shape == (4, 4)
    (img, pair), _ = tensors(spec, data, slice(2, 4))
    assert img.shape == (2, 1, 2, 2) and img.flatten().tolist() == list(range(8, 16))
    assert pair.shape == (4, 2) and pair.flatten().tolist() == list(range(8, 16))  # 2 rows as [-1, 2]
    data["img"] += 1  # writable: no shared read-only memory
    assert rows[0, 0] == 0
