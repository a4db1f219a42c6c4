"""Models in plain torch: ResNet-18/34/50/101, a small CNN and an MLP for tiny images, and the registry of every
model (:mod:`shiftbench.erm.convnets`: AlexNet, VGG-11, DenseNet-121; :mod:`shiftbench.erm.vit`: ViT-B/16).

Written here rather than imported from torchvision because torchvision does not load against the
CPU torch wheel of these machines (docs/sources.md). The ResNets follow torchvision's architecture and
parameter names (``conv1``, ``bn1``, ``layer1.0.conv1`` ..., ``fc``), so a torchvision or
``robustness`` checkpoint loads into them unchanged. Every model names its last layer (:func:`head_name`: ``fc``
unless its class says otherwise): the linear-probe mode retrains only that layer.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from shiftbench.erm import checkpoints
from shiftbench.erm.config import MODELS as CONFIG_MODELS
from shiftbench.erm.convnets import VGG, AlexNet, DenseNet
from shiftbench.erm.vit import VisionTransformer
from shiftbench.errors import InputError


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + identity)
        return result


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # stride on the 3x3 (torchvision v1.5)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        result: torch.Tensor = self.relu(out + identity)
        return result


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, 64, layers[0], 1)
        self.layer2 = self._layer(block, 128, layers[1], 2)
        self.layer3 = self._layer(block, 256, layers[2], 2)
        self.layer4 = self._layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():  # zero-init the last BN of each residual branch (Goyal et al.)
            if isinstance(module, Bottleneck):
                nn.init.zeros_(module.bn3.weight)
            elif isinstance(module, BasicBlock):
                nn.init.zeros_(module.bn2.weight)

    def _layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits


class SmallCNN(nn.Module):
    """Four conv-BN-ReLU-pool blocks and a linear head: enough for 64x64 generated images."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        channels = [3, width, width * 2, width * 4, width * 8]
        blocks: list[nn.Module] = []
        for cin, cout in itertools.pairwise(channels):
            blocks += [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            blocks.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.features(x))
        return logits


class MLP(nn.Module):
    """Two hidden layers on the flattened pixels (ConDS's simplest baseline for tiny images)."""

    def __init__(self, num_classes: int, image_size: int, hidden: int = 512) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * image_size * image_size, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.features(x))
        return logits


_BUILDERS: dict[str, Callable[[int, int], nn.Module]] = {
    "resnet18": lambda k, _: ResNet(BasicBlock, [2, 2, 2, 2], k),
    "resnet50": lambda k, _: ResNet(Bottleneck, [3, 4, 6, 3], k),
    "small_cnn": lambda k, _: SmallCNN(k),
    "mlp": lambda k, size: MLP(k, size),
    "resnet34": lambda k, _: ResNet(BasicBlock, [3, 4, 6, 3], k),
    "resnet101": lambda k, _: ResNet(Bottleneck, [3, 4, 23, 3], k),
    "alexnet": lambda k, _: AlexNet(k),
    "vgg11": lambda k, _: VGG(k),
    "densenet121": lambda k, _: DenseNet(k),
    "vit_b_16": lambda k, size: VisionTransformer(k, size),
}
MODELS = tuple(_BUILDERS)
assert MODELS == CONFIG_MODELS, "shiftbench.erm.config.MODELS must list the builders"


def head_name(model: nn.Module) -> str:
    """The name of the model's last layer: what the linear probe retrains and whose input the feature methods read."""
    return str(getattr(model, "head_name", "fc"))


def build_model(name: str, num_classes: int, image_size: int) -> nn.Module:
    if name not in _BUILDERS:
        raise InputError(f"unknown model {name!r}; known: {', '.join(MODELS)}", parameter="model")
    return _BUILDERS[name](num_classes, image_size)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What a checkpoint gave the model: recorded with the run (``erm_runs.config``, key ``init``)."""

    loaded: list[str]  # parameters and buffers set from the checkpoint
    left_at_init: list[str]  # the model's own that it did not set (the head skipped, or partial loading)
    ignored: list[str]  # the checkpoint's that the model has no place for (partial loading only)
    file: dict[str, object]  # the loaded bytes' SHA-256 and size (checkpoints.CheckpointFile.record)

    def as_dict(self) -> dict[str, object]:
        return {"loaded": len(self.loaded), "left_at_init": self.left_at_init, "ignored": self.ignored, **self.file}


def load_checkpoint(
    model: nn.Module, path: Path, *, keep_head: bool, partial: bool = False, name: str | None = None
) -> LoadedCheckpoint:
    """Load a user's weights (a state dict, or a dict with ``state_dict``/``model``; ``module.`` prefixes
    stripped). With ``keep_head=False`` the last layer (:func:`head_name`) is skipped, for a checkpoint trained on
    other classes.

    The checkpoint must cover the model: a missing or extra entry, or one of another shape, is refused naming it,
    unless ``partial`` (``init_partial: true``) says loading part of it is intended, e.g. ImageNet weights whose
    1000-class head is replaced. A checkpoint that sets nothing is refused either way. The bytes are read once
    and checked (:func:`checkpoints.read`: CRC-32s, a registered ``name``'s SHA-256), and their hash is recorded."""
    file = checkpoints.read(path, name)
    try:
        payload = torch.load(io.BytesIO(file.data), map_location="cpu", weights_only=True)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"not a torch checkpoint: {reason}", path=path, parameter="init_checkpoint") from None
    for key in ("state_dict", "model"):
        if isinstance(payload, dict) and isinstance(payload.get(key), dict):
            payload = payload[key]
    if not isinstance(payload, dict) or not all(isinstance(v, torch.Tensor) for v in payload.values()):
        raise InputError("expected a state dict (parameter names to tensors)", path=path, parameter="init_checkpoint")
    state = {str(k).removeprefix("module."): v for k, v in payload.items()}
    head = head_name(model) + "."
    if not keep_head:
        state = {k: v for k, v in state.items() if not k.startswith(head)}
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    extra = [k for k in state if k not in own]
    if not partial and (wrong or extra):
        if wrong:
            problem = (
                f"shape mismatch for {wrong[0]}: checkpoint {tuple(state[wrong[0]].shape)}, "
                f"model {tuple(own[wrong[0]].shape)}"
            )
        else:
            problem = f"{len(extra)} parameters do not belong to this model, e.g. {extra[0]}"
        raise InputError(f"{problem} (init_partial=true loads the rest)", path=path, parameter="init_checkpoint")
    usable = {k: v for k, v in state.items() if k in own and k not in wrong}
    result = model.load_state_dict(usable, strict=False)
    skipped = [] if keep_head else [k for k in own if k.startswith(head)]
    missing = [k for k in result.missing_keys if k not in skipped]
    if missing and not partial:
        raise InputError(
            f"the checkpoint covers {len(usable)} of {len(own) - len(skipped)} entries of the model, e.g. not "
            f"{missing[0]} (init_partial=true loads what it has)",
            path=path,
            parameter="init_checkpoint",
        )
    loaded = [k for k in own if k in usable]
    if not loaded:
        raise InputError("the checkpoint sets none of the model's parameters", path=path, parameter="init_checkpoint")
    return LoadedCheckpoint(
        loaded, sorted(set(result.missing_keys) | set(skipped)), sorted(extra + wrong), file.record()
    )
