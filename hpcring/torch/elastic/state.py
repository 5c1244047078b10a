"""`hvd.elastic.TorchState(model, optimizer, **kwargs)`: a model, optimizer, LR scheduler, ElasticSampler and
plain values tracked together, with Horovod's handler registry (`get_handler_registry` /
`set_handler_registry`: pairs of (type, handler class)).

A handler turns its object into a snapshot (its `state_dict()`: references to live tensors, no copy) and loads
one back; `ObjectState` encodes the snapshots of all handlers into one commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcring.torch.elastic.common import ObjectState
from hpcring.torch.elastic.sampler import ElasticSampler


class StateHandler:
    """Snapshot and reload one object of a known type."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def snapshot(self) -> Any:
        return self.value.state_dict()

    def load(self, snap: Any) -> None:
        self.value.load_state_dict(snap)

    def set_value(self, value: Any) -> None:
        self.value = value


class ModelStateHandler(StateHandler):
    """A torch.nn.Module: its state_dict (parameters and buffers)."""


class OptimizerStateHandler(StateHandler):
    """A torch.optim.Optimizer (a DistributedOptimizer too): its state and param groups (learning rates)."""

    def load(self, snap: Any) -> None:
        # load_state_dict keeps tensors that already have the parameter's dtype and device: give it copies, so
        # the optimizer's in-place updates never write into a commit buffer.
        self.value.load_state_dict(_clone_tensors(snap))


class LRSchedulerStateHandler(StateHandler):
    """A learning-rate scheduler: its counters."""


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: epoch and samples processed; loading it repartitions the rest over the new world."""


def _clone_tensors(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone_tensors(v) for v in value]
    return value


_handler_registry: list[tuple[type, Callable[[Any], StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (torch.optim.lr_scheduler.LRScheduler, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, Callable[[Any], StateHandler]]]:
    """The (type, handler) pairs TorchState uses, first match wins (Horovod's API)."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, Callable[[Any], StateHandler]]]) -> None:
    """Replace the registry, e.g. to add a handler for a custom object."""
    global _handler_registry
    _handler_registry = registry


def _handler(value: Any) -> StateHandler | None:
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch training process (Horovod's `TorchState`): every keyword becomes an attribute;
    models, optimizers, schedulers and ElasticSamplers are handled by type, anything else is a plain value."""

    _handlers: dict[str, StateHandler]

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def _snapshot(self) -> dict[str, Any]:
        snap = super()._snapshot()
        snap["handlers"] = {name: h.snapshot() for name, h in self._handlers.items()}
        return snap

    def _load(self, snap: dict[str, Any]) -> None:
        for name, value in snap.get("handlers", {}).items():
            if name in self._handlers:
                self._handlers[name].load(value)
        super()._load(snap)
