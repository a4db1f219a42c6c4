"""A published split as a torch ``Dataset``: WILDS-style ``(x, y, metadata)``, each image decoded on access.

What :meth:`shiftbench.Split.dataset` gives a researcher, and how the training job decodes an image
(:func:`decode`, Pillow: no torchvision): the same pixels on both paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from shiftbench.errors import InputError
from shiftbench.splits.split_table import SplitTable


def decode(path: Path, image_size: int) -> np.ndarray:
    """One image as uint8 ``[3, S, S]``: RGB, resized (bilinear, with antialiasing) when needed."""
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
            if rgb.size != (image_size, image_size):
                rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
            return np.array(rgb, dtype=np.uint8).transpose(2, 0, 1)
    except OSError as exc:
        raise InputError(f"cannot decode image: {exc}", path=path) from None


class SplitDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int, torch.Tensor]]):
    """WILDS-style items ``(x uint8 [3, S, S], y, metadata)`` decoded on access."""

    def __init__(self, table: SplitTable, paths: Sequence[Path], indices: np.ndarray, image_size: int) -> None:
        self.table, self.paths, self.indices, self.image_size = table, paths, indices, image_size

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, item: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        row = int(self.indices[item])
        x = torch.from_numpy(decode(self.paths[row], self.image_size))
        return x, int(self.table.y[row]), torch.from_numpy(self.table.metadata[row])
