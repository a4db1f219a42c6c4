"""Registered pretrained weights: a preset names them, the user places the file once, the launcher verifies it.

A preset that starts from ImageNet weights (MetaShift/DomainBed) says ``init_checkpoint:
imagenet:resnet18``, never a path: the run's name and results do not depend on where a machine keeps
the file. Nothing is downloaded here (training machines are often offline); a missing file is one line
saying which URL to fetch into which folder. torchvision's files are looked up where torchvision itself
caches them (``$TORCH_HOME/hub/checkpoints``), so a machine that already used them needs nothing. The
file is checked against the SHA-256 prefix torchvision puts in its name (as ``torch.hub`` checks it), when the
launcher finds it and again when the job loads it.

Any checkpoint a run loads, a user's file included, is read once by :func:`read`: the bytes it hashes are the
bytes torch loads, and the run records their SHA-256 and size (``erm_runs.config``, key ``init``). A file in
``torch.save``'s zip format must pass the CRC-32 of every member (torch itself does not check them), so a torn or
flipped file is refused naming it; torch's legacy pickle format carries no checksum and is recorded only.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from shiftbench.errors import InputError


@dataclass(frozen=True)
class RegisteredCheckpoint:
    """A published weights file our models load unchanged (torchvision's parameter names). A dataclass, not a
    pydantic model: the lean training job imports this module where only torch, numpy, pyarrow and Pillow are."""

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
        read(path)  # a missing, torn or corrupt file is refused before anything trains
        return path
    if entry.model != model:
        raise InputError(f"{value} holds {entry.model} weights, the run trains {model}", parameter="init_checkpoint")
    dirs = search_dirs(checkpoint_dir)
    for folder in dirs:
        path = folder / entry.file
        if path.is_file():
            read(path, value)
            return path
    raise InputError(
        f"{value} is not on this machine: download {entry.url} into {dirs[0]} "
        "(SHIFTBENCH_CHECKPOINT_DIR, or torchvision's cache)",
        parameter="init_checkpoint",
    )


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6: a zip archive of stored members


@dataclass(frozen=True)
class CheckpointFile:
    """The bytes of a checkpoint as a run loads them, read once."""

    path: Path
    data: bytes
    sha256: str

    def record(self) -> dict[str, object]:
        """What the run records of the file it loaded (beside what loaded into the model)."""
        return {"sha256": self.sha256, "bytes": len(self.data)}


def read(path: Path, name: str | None = None) -> CheckpointFile:
    """``path``'s bytes, checked: every member of a zip checkpoint passes its CRC-32, and the file of a registered
    ``name`` (``imagenet:resnet18``) matches the SHA-256 prefix of its name; otherwise one line naming the file."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise InputError("checkpoint not found", path=path, parameter="init_checkpoint") from None
    except OSError as exc:
        raise InputError(f"unreadable checkpoint ({exc.strerror})", path=path, parameter="init_checkpoint") from None
    _require_intact(path, data)
    digest = hashlib.sha256(data).hexdigest()
    entry = REGISTRY.get(name) if name is not None else None
    if entry is not None and not digest.startswith(entry.sha256_prefix):
        raise InputError(
            f"SHA-256 {digest[:12]}... does not match {name} ({entry.sha256_prefix}...): a partial, damaged or "
            f"different download; fetch {entry.url} again",
            path=path,
            parameter="init_checkpoint",
        )
    return CheckpointFile(path, data, digest)


def _require_intact(path: Path, data: bytes) -> None:
    """A zip checkpoint whose structure or any member's CRC-32 is wrong (a torn copy, a flipped byte) is refused."""
    if not data.startswith(ZIP_MAGIC):
        return  # torch's legacy format (a pickle stream) has no checksum to compare: recorded, not checked
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError, zlib.error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"torn or corrupt checkpoint (its zip archive does not read: {reason})",
            path=path,
            parameter="init_checkpoint",
        ) from None
    if bad is not None:
        raise InputError(
            f"corrupt checkpoint: {bad} does not match its CRC-32 (a damaged copy)",
            path=path,
            parameter="init_checkpoint",
        )
