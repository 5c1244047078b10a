"""`hpcring.spark.torch.TorchEstimator` on the shared local Spark cluster (conftest): the trained weights
equal one process trained on the combined data, the history and the store's data and checkpoints, the
validation split and column, save/load/transform alone and in a PipelineModel, and refused parameters.

The fits are module fixtures (each launches a world through hpcring.spark.run); the tests read them."""

from __future__ import annotations

import functools
import glob
import io
import json
import os
from typing import Any

import estimator_programs as ep
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.timeout(300)
LR, MOMENTUM, EPOCHS = 0.02, 0.9, 3


@pytest.fixture(scope="module")
def frame(spark: Any) -> Any:
    """64 rows in a known order over 3 partitions: id, x (3 values), s, y, is_val (every 4th row), and x's
    four values as scalar columns a..d (for a VectorAssembler)."""
    from pyspark.sql import types as T

    x, y = ep.data()
    rows = [
        (i, [float(v) for v in x[i, :3]], float(x[i, 3]), float(y[i]), i % 4 == 3, *map(float, x[i]))
        for i in range(ep.ROWS)
    ]
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("x", T.ArrayType(T.DoubleType())),
            T.StructField("s", T.DoubleType()),
            T.StructField("y", T.DoubleType()),
            T.StructField("is_val", T.BooleanType()),
            *[T.StructField(c, T.DoubleType()) for c in "abcd"],
        ]
    )
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, 3), schema)


def _estimator(store_dir: str, **kwargs: Any) -> Any:
    from hpcring.spark.common.store import Store
    from hpcring.spark.torch import TorchEstimator

    torch.manual_seed(0)
    model = kwargs.pop("model", None) or ep.TwoInputs()
    settings = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        "loss": torch.nn.MSELoss(),
        "feature_cols": ["x", "s"],
        "label_cols": ["y"],
        "store": Store.create(store_dir),
        "shuffle": False,
        "verbose": 0,
        **kwargs,
    }
    return TorchEstimator(**settings)


@pytest.fixture(scope="module")
def fit2(frame: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """num_proc 2, batch 8, an array and a scalar feature, a metric and a callback."""
    folder = str(tmp_path_factory.mktemp("callbacks"))
    est = _estimator(
        str(tmp_path_factory.mktemp("store2")),
        num_proc=2,
        batch_size=8,
        epochs=EPOCHS,
        run_id="np2",
        metrics=[ep.mae],
        callbacks=[functools.partial(ep.record_epoch, folder)],
    )
    initial = ep.copy.deepcopy(est.getModel())
    return {"estimator": est, "initial": initial, "model": est.fit(frame), "callbacks": folder}


@pytest.fixture(scope="module")
def fit4(frame: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """num_proc 4, batch 4, in a Pipeline: a VectorAssembler makes a Spark ML vector feature."""
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    est = _estimator(
        str(tmp_path_factory.mktemp("store4")),
        model=model,
        feature_cols=["features"],
        num_proc=4,
        batch_size=4,
        epochs=2,
    )
    initial = ep.copy.deepcopy(model)
    assembler = VectorAssembler(inputCols=list("abcd"), outputCol="features")
    return {"estimator": est, "initial": initial, "pipeline": Pipeline(stages=[assembler, est]).fit(frame)}


def _close(got: torch.nn.Module, want: torch.nn.Module) -> None:
    for (name, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"parameter {name}")


def test_np2_weights_and_history_equal_one_process(fit2: dict[str, Any]) -> None:
    x, y = ep.data()
    want, losses, maes = ep.reference(
        fit2["initial"], x, y, batch=16, epochs=EPOCHS, lr=LR * 2, momentum=MOMENTUM
    )
    model = fit2["model"]
    _close(model.getModel(), want)
    history = model.getHistory()
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    assert [h["train"]["loss"] for h in history] == pytest.approx(losses, rel=1e-5)
    assert [h["train"]["all_metrics"][0]["group_0_y"] for h in history] == pytest.approx(maes, rel=1e-5)
    assert "validation" not in history[0]
    # The returned optimizer holds the trained state with the learning rate as the user gave it.
    opt = model.getOptimizer()
    assert opt.param_groups[0]["lr"] == pytest.approx(LR)
    assert all(
        a is b for a, b in zip(opt.param_groups[0]["params"], model.getModel().parameters(), strict=True)
    )


def test_np4_vector_feature_in_a_pipeline_equals_one_process(fit4: dict[str, Any]) -> None:
    x, y = ep.data()
    want, losses, _ = ep.reference(fit4["initial"], x, y, batch=16, epochs=2, lr=LR * 4, momentum=MOMENTUM)
    trained = fit4["pipeline"].stages[-1]
    _close(trained.getModel(), want)
    assert [h["train"]["loss"] for h in trained.getHistory()] == pytest.approx(losses, rel=1e-5)


def test_the_store_holds_the_shards_and_checkpoints(fit2: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    store = fit2["estimator"].getStore()
    train = store.get_localized_path(store.get_train_data_path())
    shards = sorted(os.path.basename(p) for p in glob.glob(f"{train}/hpcring_shard=*"))
    assert shards == ["hpcring_shard=0", "hpcring_shard=1"]
    rows = [pq.read_table(f"{train}/{s}", columns=["hpcring_row"]).column(0).to_pylist() for s in shards]
    assert sorted(rows[0]) == list(range(0, ep.ROWS, 2))
    assert sorted(rows[1]) == list(range(1, ep.ROWS, 2))
    checkpoint = store.get_checkpoint_path("np2") + "/" + store.get_checkpoint_filename()
    assert store.get_checkpoints("np2") == [checkpoint]
    state = torch.load(io.BytesIO(store.read(checkpoint)), weights_only=False)
    assert state["epoch"] == EPOCHS - 1
    for name, value in fit2["model"].getModel().state_dict().items():
        torch.testing.assert_close(state["model"][name], value)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(LR)


def test_callbacks_run_on_every_rank_after_each_epoch(fit2: dict[str, Any]) -> None:
    history = fit2["model"].getHistory()
    for epoch in range(EPOCHS):
        for rank in range(2):
            with open(f"{fit2['callbacks']}/epoch{epoch}-rank{rank}.json") as f:
                assert json.load(f) == history[epoch]


def test_validation_column(frame: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """is_val marks 16 rows: 48 train (3 steps of 8 per rank), and one validation step of 8 per rank that
    covers all 16, so the last epoch's validation loss is the trained model's MSE on them."""
    est = _estimator(
        str(tmp_path_factory.mktemp("store_val")),
        num_proc=2,
        batch_size=8,
        val_batch_size=8,
        epochs=2,
        validation="is_val",
    )
    initial = ep.copy.deepcopy(est.getModel())
    model = est.fit(frame)
    x, y = ep.data()
    train, val = np.arange(ep.ROWS) % 4 != 3, np.arange(ep.ROWS) % 4 == 3
    want, losses, _ = ep.reference(
        initial, x[train], y[train], batch=16, epochs=2, lr=LR * 2, momentum=MOMENTUM
    )
    _close(model.getModel(), want)
    history = model.getHistory()
    assert [h["train"]["loss"] for h in history] == pytest.approx(losses, rel=1e-5)
    xv = torch.tensor(x[val], dtype=torch.float32)
    with torch.no_grad():
        out = want(xv[:, :3], xv[:, 3:])
    mse = float(torch.nn.functional.mse_loss(out, torch.tensor(y[val], dtype=torch.float32).reshape(-1, 1)))
    assert history[-1]["validation"]["loss"] == pytest.approx(mse, rel=1e-5)


def test_validation_split(frame: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    import pyarrow.parquet as pq

    est = _estimator(
        str(tmp_path_factory.mktemp("store_split")), num_proc=2, batch_size=4, validation=0.25, random_seed=7
    )
    history = est.fit(frame).getHistory()
    assert len(history) == 1 and history[0]["validation"]["loss"] > 0
    store = est.getStore()
    train = pq.read_table(store.get_localized_path(store.get_train_data_path()), columns=["y"]).column(0)
    val = pq.read_table(store.get_localized_path(store.get_val_data_path()), columns=["y"]).column(0)
    assert 0 < len(val) < ep.ROWS // 2
    assert sorted(train.to_pylist() + val.to_pylist()) == sorted(ep.data()[1].tolist())
