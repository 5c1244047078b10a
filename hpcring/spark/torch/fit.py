"""The driver's side of `TorchEstimator.fit`: processes, data preparation, steps, and the run itself."""

from __future__ import annotations

from typing import Any

from hpcring.errors import ConfigError
from hpcring.spark.common.prepare import Prepared, describe, prepare
from hpcring.spark.torch.remote import TrainSpec, train


def _num_proc(df: Any, num_proc: int | None) -> int:
    """num_proc as `hpcring.spark.run` checks it (default: the cluster's task slots; more than it has is
    refused), checked before the data preparation's Spark jobs, as are the executors' Python and MPI."""
    from hpcring.spark import executors, options

    executors.check(df.sparkSession.sparkContext, "TorchEstimator")  # before the preparation's Spark jobs
    try:
        return options.num_proc(df.sparkSession.sparkContext, num_proc)
    except ConfigError as exc:
        raise ConfigError(f"TorchEstimator: {exc}") from None


def _steps(values: dict[str, Any], prepared: Prepared, n: int) -> tuple[int, int, int]:
    """(train steps, validation batch size, validation steps) per epoch; equal on every rank."""
    batch = int(values["batch_size"])
    if prepared.train_rows < batch * n:
        raise ConfigError(
            f"TorchEstimator: {prepared.train_rows} training rows are fewer than batch_size * num_proc = "
            f"{batch} * {n}: lower batch_size or num_proc"
        )
    steps = values["train_steps_per_epoch"] or prepared.train_rows // (batch * n)
    val_batch = int(values["val_batch_size"] or batch)
    if prepared.val_path is None:
        return steps, val_batch, 0
    if prepared.val_rows < n:
        raise ConfigError(
            f"TorchEstimator: validation={values['validation']!r} leaves {prepared.val_rows} "
            f"validation rows, fewer than num_proc={n}"
        )
    val_steps = values["validation_steps_per_epoch"] or max(1, prepared.val_rows // (val_batch * n))
    return steps, val_batch, val_steps


def _input_shapes(values: dict[str, Any], prepared: Prepared) -> list[list[int]]:
    if values["input_shapes"] is not None:
        return [list(s) for s in values["input_shapes"]]
    return [[-1, prepared.columns[c].size] for c in values["feature_cols"]]


def checkpoint_file(store: Any, run_id: str) -> str | None:
    """The run's checkpoint file (full path), None when the store keeps no runs."""
    folder = store.get_checkpoint_path(run_id)
    return None if folder is None else f"{folder}/{store.get_checkpoint_filename()}"


def resume_state(store: Any, path: str | None, verbose: int) -> bytes | None:
    """The run's last checkpoint (`path`) when the store has one: a fit with the `run_id` of an earlier
    one resumes from its model and optimizer state, as Horovod's estimator does."""
    if path is None or not store.exists(path):
        return None
    if verbose:
        print(f"TorchEstimator: resuming training from the last checkpoint: {path}", flush=True)
    return bytes(store.read(path))


def fit(df: Any, values: dict[str, Any], run_id: str) -> tuple[dict[str, Any], Prepared]:
    """Prepare `df` into the store and train; returns rank 0's result (with the input shapes) and what
    was prepared."""
    import hpcring.spark

    features, labels = list(values["feature_cols"]), list(values["label_cols"])
    describe(df.schema, features, "feature_cols")
    describe(df.schema, labels, "label_cols")
    backend = values["backend"]
    n = int(backend.num_processes()) if backend is not None else _num_proc(df, values["num_proc"])
    store = values["store"]
    prepared = prepare(df, store, features, labels, values["validation"], n, values["random_seed"])
    steps, val_batch, val_steps = _steps(values, prepared, n)
    checkpoint = checkpoint_file(store, run_id)
    shapes = _input_shapes(values, prepared)
    spec = TrainSpec(
        feature_cols=features,
        label_cols=labels,
        columns=prepared.columns,
        input_shapes=shapes,
        batch_size=int(values["batch_size"]),
        val_batch_size=val_batch,
        epochs=int(values["epochs"]),
        steps=steps,
        val_steps=val_steps,
        shuffle=bool(values["shuffle"]),
        seed=values["random_seed"],
        train_path=store.get_localized_path(prepared.train_path),
        val_path=store.get_localized_path(prepared.val_path) if prepared.val_path else None,
        checkpoint_file=None if checkpoint is None else store.get_localized_path(checkpoint),
        verbose=int(values["verbose"]),
        backward_passes_per_step=int(values["backward_passes_per_step"]),
    )
    args = (
        spec,
        values["model"],
        values["optimizer"],
        values["loss"],
        values["metrics"],
        values["callbacks"],
        resume_state(store, checkpoint, int(values["verbose"])),
    )
    if backend is not None:
        results = backend.run(train, args=args)
    else:
        results = hpcring.spark.run(train, args=args, num_proc=n)
    return {**results[0], "input_shapes": shapes}, prepared
