"""The line rank 0 prints per epoch when `verbose` is set: epochs counted from 1, metrics by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def metric_names(groups: Sequence[Sequence[Callable[..., Any]]], labels: Sequence[str]) -> list[list[str]]:
    """A readable name per metric value: the function's name, with the label column when there are several."""
    names = []
    for g, fns in enumerate(groups):
        row = []
        for fn, label in zip(fns, labels, strict=True):
            base = getattr(fn, "__name__", "") or f"metric_{g}"
            if base == "<lambda>":
                base = f"metric_{g}"
            row.append(f"{base}[{label}]" if len(labels) > 1 else base)
        names.append(row)
    return names


def _values(part: dict[str, Any], names: list[list[str]]) -> list[str]:
    out = [f"loss {part['loss']:.4f}"]
    for g, group in enumerate(part.get("all_metrics", [])):
        for i, value in enumerate(group.values()):
            out.append(f"{names[g][i]} {value:.4f}")
    return out


def format_epoch(epoch: int, last: int, entry: dict[str, Any], seconds: float, names: list[list[str]]) -> str:
    """`epoch 3/10  loss 0.4123  accuracy 0.8812  val loss 0.5001  val accuracy 0.8610  1.25 s`; `epoch` and
    `last` are 0-based, as the history counts them."""
    parts = [f"epoch {epoch + 1}/{last + 1}", *_values(entry["train"], names)]
    if "validation" in entry:
        parts += [f"val {text}" for text in _values(entry["validation"], names)]
    return "  ".join([*parts, f"{seconds:.2f} s"])
