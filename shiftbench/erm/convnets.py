"""BREEDS Table 13's other architectures in plain torch: AlexNet, VGG-11 and DenseNet-121, as torchvision defines them.

The training environment has no torchvision (it does not load against the CPU torch wheel), so these follow
torchvision's modules layer by layer and name by name (``features.0.weight``, ``classifier.6.bias``,
``features.denseblock1.denselayer1.norm1.weight`` ...): a torchvision ``state_dict`` loads into them and gives the same
outputs (``tests/test_torchvision_parity.py``, against torchvision 0.29.1 in the clients environment). Each names its
last layer in ``head_name``: the linear probe retrains it and the feature-based methods read its input.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F


class AlexNet(nn.Module):
    """torchvision's ``alexnet`` (Krizhevsky 2014's one-GPU variant): five convolutions, three linear layers."""

    head_name = "classifier.6"

    def __init__(self, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        )  # fmt: skip
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
        return logits


VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")  # torchvision's configuration "A"


class VGG(nn.Module):
    """torchvision's ``vgg11`` (no batch norm): 3x3 convolutions and max pools, then three linear layers."""

    head_name = "classifier.6"

    def __init__(self, num_classes: int, layout: tuple[int | str, ...] = VGG11, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )  # fmt: skip
        for module in self.modules():  # torchvision's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)  # type: ignore[arg-type]
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
        return logits


class _DenseLayer(nn.Module):
    """Batch norm, ReLU, 1x1 convolution to ``bn_size * growth`` channels, then batch norm, ReLU, 3x3 to ``growth``."""

    def __init__(self, inputs: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(inputs)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(inputs, bn_size * growth, 1, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        bottleneck = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        new: torch.Tensor = self.conv2(self.relu2(self.norm2(bottleneck)))
        return new


class _DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, inputs: int, growth: int, bn_size: int) -> None:
        super().__init__()
        for k in range(layers):
            self.add_module(f"denselayer{k + 1}", _DenseLayer(inputs + k * growth, growth, bn_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


def _transition(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(
            norm=nn.BatchNorm2d(inputs), relu=nn.ReLU(inplace=True),
            conv=nn.Conv2d(inputs, outputs, 1, 1, bias=False), pool=nn.AvgPool2d(2, 2),
        )
    )  # fmt: skip


class DenseNet(nn.Module):
    """torchvision's ``densenet121`` (growth 32, blocks of 6, 12, 24 and 16 layers, 64 initial features, no dropout)."""

    head_name = "classifier"

    def __init__(
        self, num_classes: int, growth: int = 32, blocks: tuple[int, ...] = (6, 12, 24, 16), initial: int = 64,
        bn_size: int = 4,
    ) -> None:  # fmt: skip
        super().__init__()
        stem = OrderedDict(
            conv0=nn.Conv2d(3, initial, 7, 2, 3, bias=False), norm0=nn.BatchNorm2d(initial),
            relu0=nn.ReLU(inplace=True), pool0=nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        self.features = nn.Sequential(stem)
        channels = initial
        for k, layers in enumerate(blocks):
            self.features.add_module(f"denseblock{k + 1}", _DenseBlock(layers, channels, growth, bn_size))
            channels += layers * growth
            if k != len(blocks) - 1:
                self.features.add_module(f"transition{k + 1}", _transition(channels, channels // 2))
                channels //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(channels))
        self.classifier = nn.Linear(channels, num_classes)
        for module in self.modules():  # torchvision's initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.adaptive_avg_pool2d(F.relu(self.features(x), inplace=True), (1, 1))
        logits: torch.Tensor = self.classifier(torch.flatten(pooled, 1))
        return logits
