"""`hvd.elastic.ElasticSampler`: Horovod's sampler that repartitions what is left of an epoch after a reset.

Every rank shuffles the same permutation (seed + epoch), skips the `processed_num` samples the world has
already trained on this epoch, and takes every size-th of the rest from its rank. `record_batch` advances
`processed_num` by one global batch; the count is part of the committed state, so a world of another size
resumes mid-epoch without repeating or skipping a sample (up to the padding that evens out the last batch).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from hpcring.torch import basics


def _world() -> tuple[int, int]:
    return basics.size(), basics.rank()


class ElasticSampler(torch.utils.data.Sampler[int]):  # type: ignore[misc]
    """Partitions a dataset over the ranks; repartitions the unprocessed part after a reset.

    Call `record_batch(batch_idx, batch_size)` after each batch and `set_epoch(epoch)` at the end of an epoch
    (not the start: a resumed epoch must keep its count). Keep it in the `TorchState`.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch`: nothing of it is processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one batch of `batch_size` on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Recompute this rank's share for the current world, epoch and progress."""
        self.num_replicas, self.rank = _world()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        while indices and len(indices) < self.total_size:  # pad to a multiple of the world size
            indices += indices[: self.total_size - len(indices)]
        self.indices = indices[self.rank : self.total_size : self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
