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
import re
from typing import Any

import estimator_programs as ep
import numpy as np
import pytest
import torch

from hpcring.errors import ConfigError

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
    """num_proc 2, batch 8, an array and a scalar feature, a validation column, a metric and a callback.
    is_val marks 16 rows: 48 train (3 steps of 8 per rank), and one validation step of 8 per rank that
    covers all 16, so each epoch's validation loss is the model's MSE on them after that epoch."""
    folder = str(tmp_path_factory.mktemp("callbacks"))
    est = _estimator(
        str(tmp_path_factory.mktemp("store2")),
        num_proc=2,
        batch_size=8,
        epochs=EPOCHS,
        run_id="np2",
        validation="is_val",
        val_batch_size=8,
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
    train, val = np.arange(ep.ROWS) % 4 != 3, np.arange(ep.ROWS) % 4 == 3
    runs = [
        ep.reference(fit2["initial"], x[train], y[train], batch=16, epochs=e, lr=LR * 2, momentum=MOMENTUM)
        for e in range(1, EPOCHS + 1)
    ]
    want, losses, maes = runs[-1]
    model = fit2["model"]
    _close(model.getModel(), want)
    history = model.getHistory()
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    assert [h["train"]["loss"] for h in history] == pytest.approx(losses, rel=1e-5)
    assert [h["train"]["all_metrics"][0]["group_0_y"] for h in history] == pytest.approx(maes, rel=1e-5)
    xv, yv = (
        torch.tensor(x[val], dtype=torch.float32),
        torch.tensor(y[val], dtype=torch.float32).reshape(-1, 1),
    )
    for entry, (after, _, _) in zip(history, runs, strict=True):
        with torch.no_grad():
            out = after(xv[:, :3], xv[:, 3:])
        assert entry["validation"]["loss"] == pytest.approx(
            float(torch.nn.functional.mse_loss(out, yv)), rel=1e-5
        )
        assert entry["validation"]["all_metrics"][0]["group_0_y"] == pytest.approx(
            float(ep.mae(out, yv)), rel=1e-5
        )
    # The returned optimizer holds the trained state with the learning rate as the user gave it.
    opt = model.getOptimizer()
    assert opt.param_groups[0]["lr"] == pytest.approx(LR)
    assert all(
        a is b for a, b in zip(opt.param_groups[0]["params"], model.getModel().parameters(), strict=True)
    )


def test_a_spark_backend_and_backward_passes_per_step_as_horovods_example(frame: Any, tmp_path: Any) -> None:
    """Horovod's Spark example's parameters: a SparkBackend with the driver's streams and timestamps, and
    backward_passes_per_step=2 with batch 4, which accumulates the gradients of 2 batches (each loss
    halved) before each allreduce and step: the same steps as fit2's batch 8, so the same weights as one
    process with batch 16."""
    import sys

    from hpcring.spark.common.backend import SparkBackend

    backend = SparkBackend(
        num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True
    )
    est = _estimator(
        str(tmp_path),
        backend=backend,
        backward_passes_per_step=2,
        batch_size=4,
        epochs=EPOCHS,
        validation="is_val",
        val_batch_size=8,
        verbose=1,
    )
    initial = ep.copy.deepcopy(est.getModel())
    model = est.fit(frame)
    x, y = ep.data()
    train = np.arange(ep.ROWS) % 4 != 3
    want, _, _ = ep.reference(
        initial, x[train], y[train], batch=16, epochs=EPOCHS, lr=LR * 2, momentum=MOMENTUM
    )
    _close(model.getModel(), want)
    assert len(model.getHistory()) == EPOCHS
    both = _estimator(str(tmp_path), backend=backend, num_proc=2)
    assert "at most one of backend and num_proc" in str(_no_job(frame.sparkSession, both.fit, frame))


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
    assert sorted(rows[0]) == list(range(0, 48, 2))  # the 48 training rows, numbered in order
    assert sorted(rows[1]) == list(range(1, 48, 2))
    val = store.get_localized_path(store.get_val_data_path())
    assert pq.read_table(val, columns=["hpcring_row"]).num_rows == 16
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


def test_validation_split_is_sharded(frame: Any, tmp_path: Any) -> None:
    """A float validation holds out about that fraction of the rows, each part numbered in order and sharded
    by row % num_proc (training with validation is the validation column's case, in fit2)."""
    import pyarrow.parquet as pq

    from hpcring.spark.common.prepare import prepare
    from hpcring.spark.common.store import Store

    def split(folder: str, seed: int) -> tuple[Any, list[list[float]], list[float]]:
        store = Store.create(str(tmp_path / folder))
        prepared = prepare(frame, store, ["x", "s"], ["y"], 0.25, 2, seed)
        val = pq.read_table(store.get_localized_path(prepared.val_path)).to_pydict()
        train = pq.read_table(store.get_localized_path(prepared.train_path)).to_pydict()
        assert (prepared.train_rows, prepared.val_rows) == (len(train["y"]), len(val["y"]))
        for part in (train, val):
            assert sorted(part["hpcring_row"]) == list(range(len(part["y"])))
            assert [r % 2 for r in part["hpcring_row"]] == part["hpcring_shard"]
        return prepared, sorted(train["y"]), sorted(val["y"])

    prepared, train, val = split("a", 7)
    assert 0 < len(val) < ep.ROWS // 2
    assert sorted(train + val) == sorted(ep.data()[1].tolist())
    assert prepared.columns["x"].size == 3 and prepared.columns["x"].kind == "array"


def _predictions(df: Any, column: str) -> list[float]:
    return [r[column] for r in df.orderBy("id").select(column).collect()]


def test_transform_save_and_load(fit2: dict[str, Any], frame: Any, tmp_path: Any) -> None:
    from hpcring.spark.torch import TorchModel

    model = fit2["model"]
    x, _ = ep.data()
    xs = torch.tensor(x, dtype=torch.float32)
    with torch.no_grad():
        want = model.getModel()(xs[:, :3], xs[:, 3:]).reshape(-1).tolist()
    assert model.getOutputCols() == ["y__output"]
    path = str(tmp_path / "torch_model")
    model.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert loaded.uid == model.uid
    assert loaded.getHistory() == model.getHistory()
    assert (loaded.getFeatureColumns(), loaded.getLabelColumns()) == (["x", "s"], ["y"])
    assert loaded.getRunId() == "np2"
    _close(loaded.getModel(), model.getModel())
    assert loaded.getOptimizer().state_dict()["param_groups"][0]["lr"] == pytest.approx(LR)
    assert loaded.getOutputCols() == ["y__output"]
    assert _predictions(loaded.transform(frame), "y__output") == pytest.approx(want, rel=1e-6)


def test_pipeline_model_save_load_transform(fit4: dict[str, Any], frame: Any, tmp_path: Any) -> None:
    from pyspark.ml import PipelineModel

    pipeline = fit4["pipeline"]
    x, _ = ep.data()
    with torch.no_grad():
        want = pipeline.stages[-1].getModel()(torch.tensor(x, dtype=torch.float32)).reshape(-1).tolist()
    path = str(tmp_path / "pipeline")
    pipeline.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert [type(s).__name__ for s in loaded.stages] == ["VectorAssembler", "TorchModel"]
    out = loaded.transform(frame)
    assert {"features", "y__output"} <= set(out.columns)
    assert _predictions(out, "y__output") == pytest.approx(want, rel=1e-6)


def _no_job(spark: Any, fit: Any, frame: Any) -> ConfigError:
    """Run `fit(frame)`, which must raise ConfigError, and check it started no Spark job."""
    sc = spark.sparkContext
    group = f"refused-{id(fit)}"
    sc.setJobGroup(group, "a refused fit")
    try:
        with pytest.raises(ConfigError) as refused:
            fit(frame)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []
    return refused.value


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"epochs": 0}, r"epochs must be a positive integer, got 0"),
        ({"batch_size": "8"}, r"batch_size must be a positive integer"),
        ({"validation": 1.5}, r"validation must be a fraction in \[0, 1\)"),
        ({"feature_cols": "x"}, r"feature_cols must be a non-empty list of column names"),
        ({"loss": 3}, r"loss must be a callable"),
        ({"shuffle": "yes"}, r"shuffle must be True or False"),
        ({"verbose": 5}, r"verbose must be 0, 1 or 2"),
        ({"run_id": "a/b"}, r"run_id must be None or a name"),
        ({"metrics": [1]}, r"metrics must be a list whose entries are callables"),
        ({"input_shapes": [[3, -1]]}, r"input_shapes must be None or a list of shapes"),
        ({"use_gpu": False}, r"use_gpu is a Horovod parameter hpcring does not support"),
        ({"backward_passes_per_step": 0}, r"backward_passes_per_step must be a positive integer"),
        ({"backend": "spark"}, r"backend must be None or a Backend with run\(\) and num_processes\(\)"),
        ({"epoch": 2}, r"unknown parameter 'epoch'"),
    ],
)
def test_bad_values_are_refused_where_set(tmp_path: Any, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _estimator(str(tmp_path), **settings)
    est = _estimator(str(tmp_path))
    name, value = next(iter(settings.items()))
    setter = getattr(est, "set" + "".join(p.title() for p in name.split("_")), None)
    if setter is not None:
        with pytest.raises(ConfigError, match=message):
            setter(value)


def test_fit_refuses_before_any_spark_job(spark: Any, frame: Any, tmp_path: Any) -> None:
    other = torch.nn.Linear(4, 1)
    cases = [
        ({"feature_cols": ["x", "nope"]}, r"feature_cols names 'nope', which is not a column"),
        ({"label_cols": ["is_val", "id"], "loss": [torch.nn.MSELoss()]}, r"one loss per label column"),
        ({"feature_cols": ["x", "s"], "label_cols": ["s"]}, r"label_cols must be columns that are not"),
        ({"validation": "missing"}, r"validation='missing' must name a boolean or 0/1 column"),
        ({"num_proc": 5}, r"num_proc=5 is more than the 4 task slots"),
        ({"optimizer": torch.optim.SGD(other.parameters(), lr=0.1)}, r"optimizer must be built on the model"),
        ({"batch_size": 64}, r"64 training rows are fewer than batch_size \* num_proc = 64 \* 2"),
    ]
    for settings, message in cases[:-1]:
        est = _estimator(str(tmp_path), **settings)
        assert re.search(message, str(_no_job(spark, est.fit, frame))), settings
    # Too few rows for one step is known after counting them, before the training job.
    est = _estimator(str(tmp_path), num_proc=2, **cases[-1][0])
    with pytest.raises(ConfigError, match=cases[-1][1]):
        est.fit(frame)
    with pytest.raises(ConfigError, match=r"the 'hdfs' scheme is not supported"):
        _estimator("hdfs://namenode/x")


def test_a_fit_of_an_earlier_run_id_resumes_from_its_checkpoint(
    fit2: dict[str, Any], frame: Any, tmp_path: Any
) -> None:
    """As Horovod's estimator: a fit whose store holds a checkpoint of its run_id starts from that model
    and optimizer state. One more epoch of fit2's run (in a copy of its store) equals EPOCHS + 1 epochs of
    the one-process reference, momentum buffers included; the history counts on from EPOCHS."""
    import shutil

    source = fit2["estimator"].getStore().get_localized_path(fit2["estimator"].getStore().prefix_path)
    shutil.copytree(source, tmp_path / "store")
    resumed = _estimator(
        str(tmp_path / "store"),
        num_proc=2,
        batch_size=8,
        epochs=1,
        run_id="np2",
        validation="is_val",
        val_batch_size=8,
    ).fit(frame)
    x, y = ep.data()
    train = np.arange(ep.ROWS) % 4 != 3
    want, losses, _ = ep.reference(
        fit2["initial"], x[train], y[train], batch=16, epochs=EPOCHS + 1, lr=LR * 2, momentum=MOMENTUM
    )
    _close(resumed.getModel(), want)
    history = resumed.getHistory()
    assert [h["epoch"] for h in history] == [EPOCHS]
    assert history[0]["train"]["loss"] == pytest.approx(losses[-1], rel=1e-5)
