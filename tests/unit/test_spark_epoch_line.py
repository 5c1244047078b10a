"""The estimator's per-epoch line: epochs from 1, loss and metrics by their functions' names."""

from __future__ import annotations

from typing import Any

from hpcring.spark.torch.epoch_line import format_epoch, metric_names


def accuracy(out: Any, label: Any) -> float:
    return 1.0


def test_one_label_names_metrics_by_function() -> None:
    names = metric_names([[accuracy], [lambda out, label: 0.0]], ["y"])
    entry = {
        "epoch": 2,
        "train": {"loss": 0.41234, "all_metrics": [{"group_0_y": 0.88123}, {"group_1_y": 0.5}]},
        "validation": {"loss": 0.5, "all_metrics": [{"group_0_y": 0.861}, {"group_1_y": 0.25}]},
    }
    line = format_epoch(2, 9, entry, 1.254, names)
    assert line == (
        "epoch 3/10  loss 0.4123  accuracy 0.8812  metric_1 0.5000  "
        "val loss 0.5000  val accuracy 0.8610  val metric_1 0.2500  1.25 s"
    )


def test_several_labels_name_the_column() -> None:
    names = metric_names([[accuracy, accuracy]], ["a", "b"])
    entry = {"epoch": 0, "train": {"loss": 1.0, "all_metrics": [{"group_0_a": 0.1, "group_0_b": 0.2}]}}
    assert (
        format_epoch(0, 0, entry, 0.5, names)
        == "epoch 1/1  loss 1.0000  accuracy[a] 0.1000  accuracy[b] 0.2000  0.50 s"
    )
