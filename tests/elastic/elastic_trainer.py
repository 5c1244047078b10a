"""The training both elastic test programs run: tests/elastic/train_program.py (failures and host changes
under `hpcring run`) and tests/integration/slurm/elastic_train.py (a Slurm node lost).

A small regression model shaped like Horovod's examples/elastic/pytorch: `hvd.elastic.TorchState` with the
model, its DistributedOptimizer and an `ElasticSampler`, the learning rate scaled with the world size (and
reset when it changes), a commit every `--commit-every` steps and at each epoch's end. Each program adds its
own flags, prints its own lines and does its own failing through the `on_world`/`on_step` callbacks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import hpcring.torch as hvd


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags both programs share."""
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=-1, help="return after committing this step")
    parser.add_argument("--out", default="", help="rank 0 saves the final weights here")


class Trainer:
    """Data, model, optimizer and elastic state, built the same on every rank (hvd.init() first)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        torch.manual_seed(0)
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(1234)
        features = torch.randn(args.samples, 8, generator=g)
        targets = features @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(args.samples, 1, generator=g)
        dataset = torch.utils.data.TensorDataset(features, targets)
        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        base = torch.optim.SGD(self.model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        self.optimizer = hvd.DistributedOptimizer(base, named_parameters=self.model.named_parameters())
        self.state = hvd.elastic.TorchState(
            self.model, self.optimizer, sampler=sampler, epoch=0, batch=0, step=0
        )
        self.state.register_reset_callbacks([self._on_reset])

    def _on_reset(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = 0.01 * hvd.size()

    def weights_sum(self) -> float:
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    def run(
        self,
        on_world: Callable[[hvd.elastic.TorchState], None],
        on_step: Callable[[hvd.elastic.TorchState], None],
    ) -> str:
        """Train under `hvd.elastic.run`: `on_world` when a world starts (or re-forms), `on_step` after each
        step, before its commit. "stopped" at --stop-after, "done" after the last epoch."""
        args = self.args

        @hvd.elastic.run
        def train(state: hvd.elastic.TorchState) -> str:
            on_world(state)
            while state.epoch < args.epochs:
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    torch.nn.functional.mse_loss(self.model(x), y).backward()
                    self.optimizer.step()
                    state.sampler.record_batch(state.batch, args.batch)
                    state.batch += 1
                    state.step += 1
                    on_step(state)
                    if state.step % args.commit_every == 0:
                        state.commit()
                    if state.step == args.stop_after:
                        return "stopped"
                state.epoch += 1
                state.batch = 0
                state.sampler.set_epoch(state.epoch)
                state.commit()
            return "done"

        result: str = train(self.state)
        if args.out and hvd.rank() == 0:
            torch.save({k: v.clone() for k, v in self.model.state_dict().items()}, args.out)
        return result
