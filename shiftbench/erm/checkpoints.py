"""Registered pretrained weights: a preset names them, the user places the file once, the launcher verifies it.

A preset that starts from ImageNet weights (MetaShift/DomainBed) says ``init_checkpoint:
imagenet:resnet18``, never a path: the run's name and results do not depend on where a machine keeps
the file. Nothing is downloaded here (training machines are often offline); a missing file is one line
saying which URL to fetch into which folder. torchvision's files are looked up where torchvision itself
caches them (``$TORCH_HOME/hub/checkpoints``), so a machine that already used them needs nothing. The
file is checked against the SHA-256 prefix torchvision puts in its name (as ``torch.hub`` checks it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from shiftbench.errors import InputError


class RegisteredCheckpoint(BaseModel):
    """A published weights file our models load unchanged (torchvision's parameter names)."""

    model_config = ConfigDict(frozen=True)

    model: str
    file: str
    url: str
    sha256_prefix: str
    source: str


REGISTRY: dict[str, RegisteredCheckpoint] = {
    "imagenet:resnet18": RegisteredCheckpoint(
        model="resnet18",
        file="resnet18-f37072fd.pth",
        url="https://download.pytorch.org/models/resnet18-f37072fd.pth",
        sha256_prefix="f37072fd",
        source="torchvision ResNet18_Weights.IMAGENET1K_V1 (BSD-3-Clause), as DomainBed and MetaShift start from",
    ),
    "imagenet:resnet50": RegisteredCheckpoint(
        model="resnet50",
        file="resnet50-0676ba61.pth",
        url="https://download.pytorch.org/models/resnet50-0676ba61.pth",
        sha256_prefix="0676ba61",
        source="torchvision ResNet50_Weights.IMAGENET1K_V1 (BSD-3-Clause)",
    ),
}


def search_dirs(checkpoint_dir: Path | None) -> list[Path]:
    """``SHIFTBENCH_CHECKPOINT_DIR`` first, then torchvision's own cache."""
    torch_home = Path(os.environ.get("TORCH_HOME", Path.home() / ".cache" / "torch"))
    return [d for d in (checkpoint_dir, torch_home / "hub" / "checkpoints") if d is not None]


def resolve(value: str, model: str, checkpoint_dir: Path | None) -> Path:
    """The file an ``init_checkpoint`` value names: a registered name (verified) or a user's path."""
    entry = REGISTRY.get(value)
    if entry is None:
        if value.startswith(tuple({name.split(":")[0] + ":" for name in REGISTRY})):
            raise InputError(
                f"unknown registered checkpoint {value!r}; known: {', '.join(REGISTRY)}", parameter="init_checkpoint"
            )
        path = Path(value)
        if not path.is_file():
            raise InputError("checkpoint not found", path=path, parameter="init_checkpoint")
        return path
    if entry.model != model:
        raise InputError(f"{value} holds {entry.model} weights, the run trains {model}", parameter="init_checkpoint")
    dirs = search_dirs(checkpoint_dir)
    for folder in dirs:
        path = folder / entry.file
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if not digest.startswith(entry.sha256_prefix):
                raise InputError(
                    f"SHA-256 {digest[:12]}... does not match {value} ({entry.sha256_prefix}...): a partial or "
                    f"different download; fetch {entry.url} again",
                    path=path,
                    parameter="init_checkpoint",
                )
            return path
    raise InputError(
        f"{value} is not on this machine: download {entry.url} into {dirs[0]} "
        "(SHIFTBENCH_CHECKPOINT_DIR, or torchvision's cache)",
        parameter="init_checkpoint",
    )
