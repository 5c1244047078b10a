"""Models for `bench_ddp.py`: what a training step through DistributedOptimizer is compared on.

Defined here rather than taken from torchvision (which does not load on the CI machine). Each is small
enough that a step takes milliseconds on one core, so per-tensor overhead is visible next to the compute:

- `mlp`: the 4-layer MLP on 784 inputs (12 gradients, about 4M parameters): few, large gradients;
- `mlp200`: 100 x Linear(128, 128) (200 gradients, 6.6 MiB): many small gradients;
- `resnet`: a ResNet-style conv net on 3x32x32 images, BatchNorm after every conv (80+ gradients);
- `transformer`: a stack of small `TransformerEncoderLayer`s (12 gradients each, 120+ in all).

Every builder seeds torch itself, so two calls give identical weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class _Block(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn plus the identity (or a 1x1 conv-bn when shapes change)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNetSmall(nn.Module):
    """ResNet-18's layout (4 stages of 2 basic blocks) at a quarter of the width: 62 gradient tensors."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for stage, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(_Block(cin, cout, stride))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class TransformerSmall(nn.Module):
    """A token embedding, `layers` TransformerEncoderLayers (d_model 64, 4 heads) and a linear head."""

    def __init__(self, layers: int = 10, d_model: int = 64, vocab: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(dim=1))


def mlp(hidden: int = 1024, layers: int = 4) -> nn.Module:
    """An MLP on 784 inputs: `layers` hidden layers of `hidden` units (4 x 1024: about 4M parameters)."""
    mods: list[nn.Module] = [nn.Linear(784, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    return nn.Sequential(*mods)


def mlp200() -> nn.Module:
    """100 x Linear(128, 128) with ReLUs between: 200 small gradients.

    Weights get He (Kaiming) normal initialisation for ReLU and biases zero, as a deep ReLU network without
    normalisation needs to train at all. Under torch's default Linear initialisation each layer shrinks
    the activations' variance about 6-fold, so past a few dozen layers they are subnormal floats, and x86
    cores take a microcode assist for every operation on one: backward then took several times longer, and
    the benchmark measured those assists instead of the gradient path (the figures: docs/dev/bench-ddp.md,
    "Subnormal floats")."""
    mods: list[nn.Module] = []
    for _ in range(100):
        layer = nn.Linear(128, 128)
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
        mods += [layer, nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make()


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": mlp,
    "mlp200": mlp200,
    "resnet": ResNetSmall,
    "transformer": TransformerSmall,
}


def build(name: str) -> nn.Module:
    """The model `name` with seeded weights; ValueError naming the choices for an unknown one."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return _seeded(MODELS[name])


def batch(name: str, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """An input batch and class labels for model `name`."""
    y = torch.randint(0, 10, (size,), generator=gen)
    if name in ("mlp",):
        return torch.randn(size, 784, generator=gen), y
    if name == "mlp200":
        return torch.randn(size, 128, generator=gen), y
    if name == "resnet":
        return torch.randn(size, 3, 32, 32, generator=gen), y
    return torch.randint(0, 256, (size, 32), generator=gen), y
