"""What each rank of `TorchEstimator.fit` runs (Horovod's horovod/spark/torch/remote.py over hpcring).

The rank reads its shard of the prepared Parquet data, scales the learning rate by the world size (as
Horovod does: gradients are averaged), broadcasts rank 0's parameters and optimizer state, and trains with
`hpcring.torch.DistributedOptimizer`. Every rank takes the same number of steps per epoch; each epoch's loss
and metrics are averaged across ranks into the history, and rank 0 writes a checkpoint (model and optimizer,
learning rate unscaled) into the store's run path after each epoch.
"""

from __future__ import annotations

import functools
import io
import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpcring.files import write_whole
from hpcring.spark.common.prepare import Column
from hpcring.spark.common.shards import read_shard
from hpcring.spark.torch.epoch_line import format_epoch, metric_names


@dataclass(frozen=True)
class TrainSpec:
    """Everything a rank needs besides the model, optimizer and functions (paths are localized)."""

    feature_cols: list[str]
    label_cols: list[str]
    columns: dict[str, Column]
    input_shapes: list[list[int]]
    batch_size: int
    val_batch_size: int
    epochs: int
    steps: int
    val_steps: int
    shuffle: bool
    seed: int | None
    train_path: str
    val_path: str | None
    checkpoint_file: str | None
    verbose: int
    backward_passes_per_step: int = 1


def _per_row(shape: list[int], size: int) -> bool:
    """Whether an input shape is [-1, *one row's shape]: the whole shard can then be shaped once and a
    batch is a slice of it (no reshape per step, which the step profile showed)."""
    return bool(shape) and shape[0] == -1 and math.prod(shape[1:]) == size


def as_tensors(spec: TrainSpec, data: dict[str, Any]) -> dict[str, Any]:
    """A shard's columns as torch tensors, converted once into writable copies (pyarrow's arrays are
    read-only): features float32, shaped by input_shapes where that is per row; labels of integer columns
    int64 (for CrossEntropyLoss), other labels float32."""
    import numpy as np
    import torch

    out = {}
    for c, shape in zip(spec.feature_cols, spec.input_shapes, strict=True):
        feature = torch.from_numpy(np.array(data[c], dtype=np.float32))
        per_row = _per_row(shape, spec.columns[c].size)
        out[c] = feature.reshape(-1, *shape[1:]) if per_row else feature
    for c in spec.label_cols:
        dtype = np.int64 if spec.columns[c].dtype == "int" else np.float32
        out[c] = torch.from_numpy(np.array(data[c], dtype=dtype))
    return out


def tensors(spec: TrainSpec, data: dict[str, Any], rows: Any) -> tuple[list[Any], list[Any]]:
    """The model's inputs (one per feature column, shaped by input_shapes) and the labels of `rows` (a
    slice or an index tensor)."""
    inputs = [
        data[c][rows] if _per_row(s, spec.columns[c].size) else data[c][rows].reshape(s)
        for c, s in zip(spec.feature_cols, spec.input_shapes, strict=True)
    ]
    return inputs, [data[c][rows] for c in spec.label_cols]


def outputs_and_labels(out: Any, labels: list[Any]) -> tuple[list[Any], list[Any]]:
    """The model's outputs as a list, and each label reshaped to its output's shape where the sizes agree."""
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(outs) != len(labels):
        raise ValueError(
            f"the model returned {len(outs)} outputs for {len(labels)} label_cols: one output per label"
        )
    shaped = [
        lab.reshape(o.shape) if hasattr(o, "shape") and o.shape.numel() == lab.numel() else lab
        for o, lab in zip(outs, labels, strict=True)
    ]
    return outs, shaped


def metric_groups(metrics: Sequence[Any], n_outputs: int) -> list[list[Callable[..., Any]]]:
    """Horovod's metric groups: each entry one function for all outputs, or one per output."""
    groups = []
    for entry in metrics:
        fns = list(entry) if isinstance(entry, (list, tuple)) else [entry]
        groups.append(fns * n_outputs if len(fns) == 1 else fns)
    return groups


class _Epoch:
    """Sums of one epoch's loss and metric values on this rank, averaged across ranks at the end."""

    def __init__(self, spec: TrainSpec, metrics: Sequence[Any]) -> None:
        self.labels = spec.label_cols
        self.groups = metric_groups(metrics, len(spec.label_cols))
        self.loss = 0.0
        self.values = [[0.0] * len(spec.label_cols) for _ in self.groups]
        self.steps = 0

    def add(self, loss: Any, outs: list[Any], labels: list[Any]) -> None:
        self.loss += float(loss.detach())
        for g, fns in enumerate(self.groups):
            for i, (fn, o, lab) in enumerate(zip(fns, outs, labels, strict=True)):
                self.values[g][i] += float(fn(o.detach(), lab))
        self.steps += 1

    def averaged(self, hvd: Any) -> dict[str, Any]:
        import torch

        flat = [self.loss] + [v for group in self.values for v in group]
        mean = hvd.allreduce(torch.tensor(flat, dtype=torch.float64) / max(self.steps, 1), op=hvd.Average)
        values = mean.tolist()
        n = len(self.labels)
        groups = [
            {f"group_{g}_{label}": values[1 + g * n + i] for i, label in enumerate(self.labels)}
            for g in range(len(self.groups))
        ]
        return {"loss": values[0], "all_metrics": groups}


def _loss_fn(loss: Any) -> Callable[[list[Any], list[Any]], Any]:
    """The loss of a step: one function for every output, or one per output, summed over the outputs
    (added pairwise, without the zero tensor a `sum()` starts from)."""
    fns = list(loss) if isinstance(loss, (list, tuple)) else [loss]

    def total(outs: list[Any], labels: list[Any]) -> Any:
        per_output = fns * len(outs) if len(fns) == 1 else fns
        values = [fn(o, lab) for fn, o, lab in zip(per_output, outs, labels, strict=True)]
        return functools.reduce(operator.add, values)

    return total


def _batches(n_rows: int, batch: int, steps: int, order: Any) -> Any:
    """The rows of each step: consecutive runs of `order` (None: the shard's own order, given as slices,
    which index without a copy), wrapping round when the steps need more rows than the shard has."""
    import numpy as np
    import torch

    for step in range(steps):
        start, end = step * batch, (step + 1) * batch
        if order is None and end <= n_rows:
            yield slice(start, end)
        else:
            positions = np.arange(start, end) % n_rows
            yield torch.from_numpy(positions if order is None else order[positions])


def _order(n_rows: int, shuffle: bool, seed: int | None, epoch: int, rank: int) -> Any:
    """This epoch's permutation of the shard's rows, None without shuffling."""
    import numpy as np

    if not shuffle:
        return None
    base = 0 if seed is None else seed
    return np.random.default_rng([base, epoch, rank]).permutation(n_rows)


def _checkpoint(spec: TrainSpec, model: Any, optimizer: Any, size: int, epoch: int) -> bytes:
    """Model and optimizer state with the learning rate unscaled (a later fit scales it by its own size)."""
    import torch

    state = optimizer.state_dict()
    for group in state["param_groups"]:
        group["lr"] = group["lr"] / size
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": state, "epoch": epoch}, buffer)
    return buffer.getvalue()


def _resume(model: Any, optimizer: Any, checkpoint: bytes | None) -> int:
    """Load a checkpoint of an earlier fit of the same run (learning rate unscaled in it, as written);
    the first epoch of this fit."""
    import torch

    if checkpoint is None:
        return 0
    state = torch.load(io.BytesIO(checkpoint), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]) + 1


def train(
    spec: TrainSpec,
    model: Any,
    optimizer: Any,
    loss: Any,
    metrics: Sequence[Any],
    callbacks: Sequence[Any],
    resume: bytes | None = None,
) -> dict[str, Any]:
    """One rank's training, from `resume` (an earlier checkpoint of the run) when given; returns
    {'history', 'checkpoint' (rank 0's bytes, None elsewhere), 'epoch_s'}."""
    import torch

    import hpcring.torch as hvd

    hvd.init()
    if spec.seed is not None:
        torch.manual_seed(spec.seed)
    rank, size = hvd.rank(), hvd.size()
    names = spec.feature_cols + spec.label_cols
    data = as_tensors(spec, read_shard(spec.train_path, rank, names))
    val = as_tensors(spec, read_shard(spec.val_path, rank, names)) if spec.val_path else None
    first = _resume(model, optimizer, resume)
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * size
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    passes = spec.backward_passes_per_step
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=passes
    )
    total = _loss_fn(loss)
    history: list[dict[str, Any]] = []
    epoch_s: list[float] = []
    n_rows = len(data[names[0]])
    for epoch in range(first, first + spec.epochs):
        start = time.perf_counter()
        model.train()
        sums = _Epoch(spec, metrics)
        order = _order(n_rows, spec.shuffle, spec.seed, epoch, rank)
        for step, rows in enumerate(_batches(n_rows, spec.batch_size, spec.steps, order)):
            inputs, labels = tensors(spec, data, rows)
            if step % passes == 0:  # Horovod's: a step every `passes` batches, gradients summed between
                optimizer.zero_grad()
            outs, labels = outputs_and_labels(model(*inputs), labels)
            value = total(outs, labels)
            (value / passes if passes > 1 else value).backward()
            if (step + 1) % passes == 0 or step + 1 == spec.steps:
                optimizer.step()
            sums.add(value, outs, labels)
        entry: dict[str, Any] = {"epoch": epoch, "train": sums.averaged(hvd)}
        if val is not None:
            entry["validation"] = _validate(spec, model, val, total, metrics, hvd)
        epoch_s.append(time.perf_counter() - start)
        history.append(entry)
        if rank == 0 and spec.checkpoint_file:
            write_whole(spec.checkpoint_file, _checkpoint(spec, model, optimizer, size, epoch))
        if spec.verbose and rank == 0:
            shown = metric_names(sums.groups, spec.label_cols)
            print(format_epoch(epoch, first + spec.epochs - 1, entry, epoch_s[-1], shown), flush=True)
        for callback in callbacks:
            callback(epoch, entry)
    last = first + spec.epochs - 1
    checkpoint = _checkpoint(spec, model, optimizer, size, last) if rank == 0 else None
    return {"history": history, "checkpoint": checkpoint, "epoch_s": epoch_s}


def _validate(
    spec: TrainSpec, model: Any, val: dict[str, Any], total: Any, metrics: Any, hvd: Any
) -> dict[str, Any]:
    import torch

    model.eval()
    sums = _Epoch(spec, metrics)
    n_rows = len(val[spec.feature_cols[0]])
    with torch.no_grad():
        for rows in _batches(n_rows, spec.val_batch_size, spec.val_steps, _order(n_rows, False, None, 0, 0)):
            inputs, labels = tensors(spec, val, rows)
            outs, labels = outputs_and_labels(model(*inputs), labels)
            sums.add(total(outs, labels), outs, labels)
    return sums.averaged(hvd)
