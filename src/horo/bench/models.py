"""Models the training benches share: an MLP, and ResNet-50 (torchvision's when installed, else the same network
written out here: same layers, 161 parameter tensors, 25.6 M parameters), with synthetic batches."""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["MODELS", "batch", "make"]

MODELS = ("mlp", "resnet50")


def _mlp(width: int, layers: int, batchnorm: bool = False) -> Any:
    import torch

    dims = [256] + [width] * layers
    blocks: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(dims):
        # BatchNorm gives the model buffers (running statistics) for a strategy to broadcast, as DDP does
        blocks += [torch.nn.Linear(a, b), *([torch.nn.BatchNorm1d(b)] if batchnorm else []), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def _resnet50(classes: int) -> Any:
    try:
        from torchvision.models import resnet50

        return resnet50(num_classes=classes)
    except ImportError:
        return _own_resnet50(classes)


def _own_resnet50(classes: int) -> Any:
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inp: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.conv1, self.bn1 = nn.Conv2d(inp, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.down = None
            if stride != 1 or inp != out:
                self.down = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    inp = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inp, width, stride if i == 0 else 1))
            inp = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inp, classes)]
    return nn.Sequential(*layers)


def make(name: str, *, width: int = 1024, layers: int = 4, classes: int = 10, seed: int = 0,
         batchnorm: bool = False) -> Any:
    """A fresh model (the same weights for the same seed); ``batchnorm``: the MLP normalises each hidden layer."""
    import torch

    torch.manual_seed(seed)
    if name == "mlp":
        return _mlp(width, layers, batchnorm)
    if name == "resnet50":
        return _resnet50(classes)
    raise ValueError(f"unknown model. Received: name={name!r}. HINT: one of {', '.join(MODELS)}.")


def batch(name: str, size: int, *, image_size: int = 224, classes: int = 10, seed: int = 0,
          device: Any = "cpu") -> tuple[Any, Any]:
    """A synthetic (inputs, labels) batch for ``name``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (size, 256) if name == "mlp" else (size, 3, image_size, image_size)
    x = torch.randn(*shape, generator=g)
    y = torch.randint(0, classes, (size,), generator=g)
    return x.to(device), y.to(device)
