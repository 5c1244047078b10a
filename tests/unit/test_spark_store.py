"""The estimators' Store (hpcring.spark.common.store) and parameter checks, without Spark: which store a
prefix makes, the two views of each path, file access, and refused values."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcring.errors import ConfigError
from hpcring.spark.common.store import DBFSLocalStore, LocalStore, Store


def test_plain_and_file_paths_make_a_local_store(tmp_path: Path) -> None:
    for prefix in (str(tmp_path), f"file://{tmp_path}", f"file:{tmp_path}"):
        store = Store.create(prefix)
        assert type(store) is LocalStore
        assert store.prefix_path == f"file://{tmp_path}"
        assert store.get_train_data_path() == f"file://{tmp_path}/intermediate_train_data"
        assert store.get_val_data_path(2) == f"file://{tmp_path}/intermediate_val_data.2"
        assert store.get_run_path("r1") == f"file://{tmp_path}/runs/r1"
        assert store.get_checkpoint_path("r1") == store.get_run_path("r1")
        assert store.get_logs_path("r1") == f"file://{tmp_path}/runs/r1/logs"
        assert store.get_localized_path(store.get_run_path("r1")) == f"{tmp_path}/runs/r1"


def test_a_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Store.create("rel/store").prefix_path == f"file://{tmp_path}/rel/store"


def test_dbfs_paths_map_to_the_fuse_mount() -> None:
    for prefix in ("dbfs:/ml/store", "/dbfs/ml/store", "file:/dbfs/ml/store", "file:///dbfs/ml/store"):
        store = Store.create(prefix)
        assert type(store) is DBFSLocalStore
        assert store.prefix_path == "dbfs:/ml/store"
        assert store.get_train_data_path() == "dbfs:/ml/store/intermediate_train_data"
        assert store.get_localized_path(store.get_checkpoint_path("r")) == "/dbfs/ml/store/runs/r"
    with pytest.raises(ConfigError, match="not a DBFS path"):
        DBFSLocalStore.normalize_path("/tmp/x")


@pytest.mark.parametrize("prefix", ["hdfs://namenode:8020/x", "s3://bucket/x", "gs://b/x", "dbfs://host/x"])
def test_other_schemes_are_refused_by_name(prefix: str) -> None:
    scheme = prefix.split(":")[0]
    with pytest.raises(ConfigError, match=f"the '{scheme}' scheme is not supported"):
        Store.create(prefix)


def test_an_empty_prefix_is_refused() -> None:
    with pytest.raises(ConfigError, match="a non-empty path string"):
        Store.create("")


def test_write_read_exists_and_checkpoints(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path), checkpoint_filename="model.pt")
    assert store.get_checkpoints("r") == []
    path = store.get_checkpoint_path("r") + "/" + store.get_checkpoint_filename()
    assert not store.exists(path)
    store.write(path, b"one")
    store.write(path, b"two")  # replaced whole
    store.write_text(store.get_logs_path("r") + "/note.txt", "hello")
    assert store.exists(path) and store.read(path) == b"two"
    assert store.read(store.get_logs_path("r") + "/note.txt") == b"hello"
    assert store.get_checkpoints("r") == [path]
    assert sorted(p.name for p in (tmp_path / "runs" / "r").iterdir()) == ["logs", "model.pt"]


def test_a_store_without_runs_has_no_checkpoint_path(tmp_path: Path) -> None:
    store = Store.create(str(tmp_path), save_runs=False)
    assert not store.saving_runs()
    assert store.get_checkpoint_path("r") is None and store.get_logs_path("r") is None
    assert store.get_checkpoints("r") == []


def test_custom_train_and_runs_paths(tmp_path: Path) -> None:
    store = Store.create(
        str(tmp_path / "p"), train_path=str(tmp_path / "t"), runs_path=str(tmp_path / "runs")
    )
    assert store.get_train_data_path() == f"file://{tmp_path}/t"
    assert store.get_val_data_path() == f"file://{tmp_path}/p/intermediate_val_data"
    assert store.get_run_path("x") == f"file://{tmp_path}/runs/x"


def test_parameter_checks_name_the_parameter() -> None:
    torch = pytest.importorskip("torch")
    from hpcring.spark.torch.checks import check_complete, check_value

    for name, value, message in [
        ("num_proc", 0, "num_proc must be a positive integer or None, got 0"),
        ("num_proc", True, "num_proc must be a positive integer"),
        ("validation", -0.1, r"validation must be a fraction in \[0, 1\)"),
        ("validation", True, "validation must be"),
        ("label_cols", ["y", "y"], "label_cols must be a list of distinct column names"),
        ("model", "net", "model must be a torch.nn.Module"),
        ("optimizer", object(), "optimizer must be a torch.optim.Optimizer"),
        ("store", "/tmp/x", r"store must be a Store"),
        ("random_seed", 1.5, "random_seed must be an integer or None"),
        ("callbacks", [1], "callbacks must be a list of callables"),
        ("train_steps_per_epoch", -1, "train_steps_per_epoch must be a positive integer or None"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_value(name, value)
    for good in [
        ("validation", 0.0),
        ("validation", "col"),
        ("input_shapes", [[-1, 3], [2, 2]]),
        ("metrics", []),
    ]:
        check_value(*good)
    model = torch.nn.Linear(2, 1)
    values = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss": torch.nn.MSELoss(),
        "store": Store.create("/tmp/unused"),
        "feature_cols": ["a"],
        "label_cols": ["y"],
    }
    check_complete(values)
    with pytest.raises(ConfigError, match="store is required and not set"):
        check_complete({**values, "store": None})
    with pytest.raises(
        ConfigError, match=r"input_shapes must be one shape per feature column \(1: \['a'\]\)"
    ):
        check_complete({**values, "input_shapes": [[-1, 1], [-1, 1]]})
    with pytest.raises(ConfigError, match="validation must be a column that is neither"):
        check_complete({**values, "validation": "y"})
