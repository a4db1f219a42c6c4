"""A run's batches under a paper's image protocol (``transforms``: :mod:`shiftbench.erm.protocols`), from the
photographs as they are on disk: no image is squashed that the protocol would crop.

- Training batches: each image's random parameters drawn in the main thread from the run's seeded augmentation
  generator, in the reference's order (:func:`shiftbench.erm.photo_draws.draw`), so a seed gives the same
  batches whatever the number of workers; then every image decoded, cropped at its own aspect ratio, resized, flipped
  and colour-jittered by a pool of threads (Pillow releases the GIL while it decodes and resamples). The lighting
  noise's draws travel with the batch and are added on the device (:func:`shiftbench.erm.data.normalize`).
- ``decode: prepared``: the training photographs decoded once into a prepared copy (:mod:`shiftbench.erm.prepared`)
  and every batch cut from it, at their own resolution (the same pixels) or a smaller one (``prepared_side``).
- Evaluation batches: the protocol's deterministic evaluation transform, computed once per image into a uint8 cache
  (on the training device when it fits ``cache_budget_gib``, like :class:`shiftbench.erm.data.ImageCache`), else per
  batch.

Every image is read by :func:`shiftbench.erm.photo_pixels.open_photo`: a truncated, empty or unreadable file, a
tiny image or a decompression bomb stops the run with one line naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from shiftbench.erm import photo_draws
from shiftbench.erm import photo_pixels as pt
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.photo_workers import Cutters
from shiftbench.erm.prepared import PreparedImages, crop_from, prepare, prepared_key
from shiftbench.erm.protocols import PROTOCOLS, Protocol


@dataclass(frozen=True)
class Prepare:
    """Where and what to prepare for ``decode: prepared``: the warehouse's folder of prepared copies, the images'
    identity (split version, root, template), the training rows, the stored shorter side, and a log."""

    parent: Path
    identity: dict[str, object]
    rows: np.ndarray
    side: int
    log: Callable[[str], None]


def _eval_pixels(path: Path, protocol: Protocol, size: int) -> np.ndarray:
    return pt.eval_pixels(pt.open_photo(path), protocol, size)


def _train_pixels(path: Path, sample: pt.Draw, size: int) -> np.ndarray:
    return pt.train_pixels(pt.open_photo(path), sample, size)


def image_size(path: Path) -> tuple[int, int]:
    """Width and height from the file's header (nothing decoded); a file that has none fails when it is decoded."""
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, Image.DecompressionBombError):
        pt.open_photo(path)  # raises the file's one line
        raise


class PhotoBatches:
    """uint8 batches of a run under ``config.transforms``: :meth:`train` (random, with the lighting draws) and
    ``batches(index)`` (the evaluation transform), by example row."""

    def __init__(
        self, paths: Sequence[Path], config: TrainConfig, device: torch.device, rows: np.ndarray,
        prepared: Prepare | None = None,
    ) -> None:  # fmt: skip
        self.protocol = PROTOCOLS[config.transforms]
        self.paths, self.device, self.size = paths, device, config.image_size
        workers = config.decode_workers or min(16, os.cpu_count() or 1)
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.sizes: dict[int, tuple[int, int]] = {}  # example row -> (width, height), read when first drawn
        self.store: PreparedImages | None = None
        train_rows = prepared.rows if prepared is not None else rows
        self.slot = np.full(len(paths), -1, dtype=np.int64)  # example row -> position among the training images
        self.slot[train_rows] = np.arange(len(train_rows))
        if config.decode == "prepared":
            assert prepared is not None, "decode=prepared needs where to keep the copy"
            folder = prepared.parent / prepared_key(prepared.identity, [paths[r] for r in train_rows], prepared.side)
            record = {"images": prepared.identity, "rows": len(train_rows)}
            self.store = prepare([paths[r] for r in train_rows], folder, prepared.side, workers, record, prepared.log)
            self.sizes = {int(r): self.store.original_size(k) for k, r in enumerate(train_rows)}
        self.cutters = Cutters(workers, [paths[r] for r in train_rows], self.store, self.size) if workers > 1 else None
        budget = config.cache_budget_gib * 2**30
        needed = len(rows) * 3 * self.size * self.size
        self.cached = config.cache == "on" or (config.cache == "auto" and needed <= budget)
        self.position = np.full(len(paths), -1, dtype=np.int64)
        self.position[rows] = np.arange(len(rows))
        self.cache = None
        self.images: torch.Tensor | None = None
        if self.cached:
            arrays = self.pool.map(lambda r: _eval_pixels(paths[r], self.protocol, self.size), rows.tolist())
            self.images = torch.from_numpy(np.stack(list(arrays))) if len(rows) else torch.empty(0, 3, 1, 1)
            if device.type == "cuda":
                self.images = self.images.to(device)

    @property
    def lighting(self) -> bool:
        return bool(self.protocol.train.lighting)

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        """The evaluation transform's pixels of these rows."""
        if self.images is not None:
            return self.images.index_select(0, torch.from_numpy(self.position[index.numpy()]).to(self.images.device))
        arrays = self.pool.map(lambda r: _eval_pixels(self.paths[r], self.protocol, self.size), index.tolist())
        return torch.from_numpy(np.stack(list(arrays))).to(self.device, non_blocking=True)

    def draws(self, index: torch.Tensor, generator: torch.Generator) -> list[pt.Draw]:
        """Every image's training parameters, in batch order, from ``generator`` (the run's augmentation generator:
        saved with every checkpoint, so a resumed run draws the same)."""
        rows = index.tolist()
        missing = [r for r in rows if r not in self.sizes]
        for row, size in zip(missing, self.pool.map(lambda r: image_size(self.paths[r]), missing), strict=True):
            self.sizes[row] = size
        return [photo_draws.draw(*self.sizes[r], self.protocol.train, generator) for r in rows]

    def _train_pixels(self, row: int, sample: pt.Draw) -> np.ndarray:
        if self.store is None:
            return _train_pixels(self.paths[row], sample, self.size)
        slot = int(self.slot[row])
        cropped = crop_from(self.store.image(slot), self.store.original_size(slot), sample, self.size)
        return pt.to_array(pt.finish(cropped, sample))

    def train(self, index: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch: uint8 ``[B, 3, S, S]`` on the device, and the lighting draws ``[B, 3]`` (on the host);
        cut by worker processes where there are several cores (:mod:`shiftbench.erm.photo_workers`)."""
        samples = self.draws(index, generator)
        if self.cutters is not None:
            arrays = self.cutters.cut(zip(self.slot[index.numpy()].tolist(), samples, strict=True))
        else:
            arrays = list(
                self.pool.map(lambda job: self._train_pixels(*job), zip(index.tolist(), samples, strict=True))
            )
        pixels = torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)
        return pixels, torch.tensor([s.alphas for s in samples], dtype=torch.float32)
