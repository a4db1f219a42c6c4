"""A published split as the training job's batches: a uint8 image cache, loaders, normalisation.

The job reads the split version's Parquet files with pyarrow only (:mod:`shiftbench.splits.split_table`: GPU images have
torch and pyarrow, not polars or duckdb) and decodes images with Pillow (:func:`shiftbench.splits.split_dataset.decode`:
no torchvision, see models.py).

Two input paths:

- :class:`ImageCache` decodes every image once, resized to ``image_size``, into one uint8
  tensor ``[N, 3, H, W]`` kept on the training device when it fits (64x64: 12 KiB an image,
  a million images in 12 GiB). Batches are gathered by index on the device and normalised there,
  so training is not input-bound. This is the default whenever the cache fits its budget.
- :class:`~shiftbench.splits.split_dataset.SplitDataset` decodes per item (a ``torch.utils.data.Dataset`` for a
DataLoader with
  workers): the path for datasets too large to cache, and the naive baseline of the benchmark.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.photo_draws import lighting_offsets
from shiftbench.scoring.grouper import Grouper, require_fields
from shiftbench.splits.split_dataset import decode
from shiftbench.splits.split_table import SplitTable

# The mean and std of each normalisation (``normalization``): ImageNet's, as DomainBed and WILDS normalise; the BREEDS
# datasets' own, as the robustness library's CustomImageNet normalises them (robustness/datasets.py, lines 307-308).
STATISTICS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "robustness_custom_imagenet": ((0.4717, 0.4499, 0.3837), (0.2600, 0.2516, 0.2575)),
    "symmetric": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # x / 127.5 - 1: what takes a batch back to [0, 1] pixels
}
MEAN, STD = STATISTICS["imagenet"]
# Normalisations whose model clips its input to [0, 1] first: the robustness library's (its AttackerModel normalises
# every input with InputNormalize, which clamps), so lighting noise or Gaussian noise past the ends is clipped there.
CLAMPED = frozenset({"robustness_custom_imagenet"})


class ImageCache:
    """All images of a run decoded once into one uint8 tensor (on the device when it fits)."""

    def __init__(self, paths: Sequence[Path], image_size: int, device: torch.device, workers: int | None = None):
        self.images = torch.empty((len(paths), 3, image_size, image_size), dtype=torch.uint8)
        # Pillow releases the GIL while decoding and resizing: threads scale without pickling.
        with ThreadPoolExecutor(max_workers=workers or min(16, os.cpu_count() or 1)) as pool:
            for index, array in enumerate(pool.map(lambda p: decode(p, image_size), paths, chunksize=64)):
                self.images[index] = torch.from_numpy(array)
        if device.type == "cuda":
            self.images = self.images.to(device, non_blocking=False)

    @staticmethod
    def bytes_needed(n: int, image_size: int) -> int:
        return n * 3 * image_size * image_size

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        return self.images.index_select(0, index.to(self.images.device))


class Batches:
    """uint8 batches by example index: from the cache, or decoded per batch by a thread pool."""

    def __init__(self, paths: Sequence[Path], config: TrainConfig, device: torch.device, rows: np.ndarray) -> None:
        budget = config.cache_budget_gib * 2**30
        needed = ImageCache.bytes_needed(len(rows), config.image_size)
        self.cached = config.cache == "on" or (config.cache == "auto" and needed <= budget)
        self.device, self.size = device, config.image_size
        self.paths = paths
        workers = config.decode_workers or None
        # Only the rows a run touches are decoded; position maps an example row to its cache slot.
        self.position = np.full(len(paths), -1, dtype=np.int64)
        self.position[rows] = np.arange(len(rows))
        self.cache = ImageCache([paths[r] for r in rows], config.image_size, device, workers) if self.cached else None
        self.pool = None if self.cached else ThreadPoolExecutor(max_workers=workers)

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        if self.cache is not None:
            return self.cache.batch(torch.from_numpy(self.position[index.numpy()]))
        assert self.pool is not None
        arrays = list(self.pool.map(lambda r: decode(self.paths[r], self.size), index.tolist()))
        return torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)


@functools.cache
def pixel_constants(kind: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std ``[1, 3, 1, 1]`` that take a normalised batch back to [0, 1] pixels (``x * std + mean``)."""
    return _constants(kind, device)


def standardize(pixels: torch.Tensor, kind: str) -> torch.Tensor:
    """Float pixels (about [0, 1]) to the model's input under ``kind``: clipped to [0, 1] first for a :data:`CLAMPED`
    normalisation, the clip's gradient 1 inside [0, 1] and at its ends, 0 outside (torch 2.13's and the BREEDS authors'
    torch's ``clamp``; torch 2.14 gives 0 at the ends), written out so that no torch version changes an attack."""
    if kind in CLAMPED:
        inside = (pixels >= 0) & (pixels <= 1)
        pixels = torch.where(inside, pixels, pixels.detach().clamp(0, 1))
    mean, std = _constants(kind, pixels.device)
    return (pixels - mean) / std


def _constants(kind: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A normalisation's mean and std on ``device``, made once: built on the host every step they were a copy to the
    GPU per step, which also rules out capturing the step in a CUDA graph."""
    mean, std = STATISTICS[kind]
    return torch.tensor(mean, device=device).view(1, 3, 1, 1), torch.tensor(std, device=device).view(1, 3, 1, 1)


def normalize(
    batch: torch.Tensor, *, channels_last: bool, kind: str = "imagenet", lighting: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` -> float on the batch's device: ``ToTensor``'s [0, 1], then a dataset's mean and std
    (``imagenet``: DomainBed, WILDS; ``robustness_custom_imagenet``: the robustness library's BREEDS datasets), or
    ``symmetric``, pixels in (-1, 1) as ConDS feeds its models (Appendix A.4). ``lighting``: each image's three PCA
    lighting draws ``[B, 3]``, whose offset is added to the [0, 1] pixels first, unclipped, as the robustness library's
    Lighting does; a :data:`CLAMPED` normalisation then clips to [0, 1], as that library's model does before it
    normalises (``robustness/tools/helpers.py``, ``InputNormalize``, lines 98-101). The result's memory layout is
    fixed (channels last or not) whatever the batch's: a convolution's float sums depend on it, and a batch stacked
    from worker processes is laid out unlike one stacked from threads."""
    x = batch.float()
    if kind == "symmetric":
        x = x.div_(127.5).sub_(1.0)
    elif lighting is not None and kind in CLAMPED:
        offsets = lighting_offsets(lighting.to(x.device, non_blocking=True)).view(-1, 3, 1, 1)
        x = standardize(x.mul_(1.0 / 255.0).add_(offsets), kind)
    elif lighting is not None:  # one multiply-add per pixel: (x / 255 + offset - mean) / std, a training batch's
        mean, std = _constants(kind, x.device)
        offsets = lighting_offsets(lighting.to(x.device, non_blocking=True)).view(-1, 3, 1, 1)
        x = x.mul_(1.0 / (255.0 * std)).add_((offsets - mean) / std)
    else:
        x = x.div_(255.0)
        mean, std = _constants(kind, x.device)
        x = x.sub_(mean).div_(std)
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def training_groups(table: SplitTable, group_by: str) -> tuple[np.ndarray, list[str]]:
    """Each example's group under ``group_by`` and the groups' names (:class:`shiftbench.scoring.grouper.Grouper`:
    ``group`` is the split's own groups; ``y,object_color`` label x spurious attribute, Sagawa et al.)."""
    grouper = Grouper.parse(group_by)
    require_fields(grouper, table.metadata_fields, parameter="group_by", what="this split")
    return grouper.assign([table.decoded(field) for field in grouper.fields])


class BatchStream:
    """A run's training batches (example rows), forever, resumable from :meth:`state`.

    A stream is a sequence of draws ("rounds": an epoch's permutation, or one batch) from its seeded generator;
    the state is the generator's state at the start of the current round and the batches taken from it, so a
    resumed stream redraws that round and continues exactly where the interrupted one stopped.
    """

    def __init__(self, draw: Callable[[torch.Generator], list[torch.Tensor]], generator: torch.Generator) -> None:
        self.draw, self.generator = draw, generator
        self.round: list[torch.Tensor] = []
        self.taken, self.round_state = 0, generator.get_state()

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        if self.taken == len(self.round):
            self.round_state = self.generator.get_state()
            self.round, self.taken = self.draw(self.generator), 0
        self.taken += 1
        return self.round[self.taken - 1]

    def state(self) -> dict[str, Any]:
        return {"generator": self.round_state, "taken": self.taken, "drawn": bool(self.round)}

    def restore(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.round_state, self.round, self.taken = state["generator"], [], 0
        if state["drawn"]:
            self.round, self.taken = self.draw(self.generator), int(state["taken"])


def standard_batches(indices: np.ndarray, batch_size: int, generator: torch.Generator) -> BatchStream:
    """Shuffled epochs without replacement, forever (a short last batch is dropped unless it is all)."""
    pool = torch.from_numpy(indices)

    def epoch(generator: torch.Generator) -> list[torch.Tensor]:
        order = pool[torch.randperm(pool.numel(), generator=generator)]
        full = max(1, order.numel() // batch_size)
        return [order[start : start + batch_size] for start in range(0, full * batch_size, batch_size)]

    return BatchStream(epoch, generator)


def group_balanced_batches(
    indices: np.ndarray, group_index: np.ndarray, batch_size: int, generator: torch.Generator
) -> BatchStream:
    """Every group equally likely per draw, examples uniform within it (WILDS ``uniform_over_groups``)."""
    groups = group_index[indices]
    counts = np.bincount(groups)
    weights = torch.from_numpy(1.0 / counts[groups]).double()
    pool = torch.from_numpy(indices)
    return BatchStream(
        lambda generator: [pool[torch.multinomial(weights, batch_size, replacement=True, generator=generator)]],
        generator,
    )


def group_batches(
    indices: np.ndarray, group_index: np.ndarray, batch_size: int, groups_per_batch: int, generator: torch.Generator
) -> BatchStream:
    """``groups_per_batch`` distinct training groups per batch, drawn uniformly, with an equal share of
    the batch each, examples drawn with replacement within a group (WILDS' GroupSampler; IRM and CORAL
    compare groups within a batch, so each batch must hold several)."""
    groups = group_index[indices]
    present = np.unique(groups)
    members = [torch.from_numpy(indices[groups == g]) for g in present]
    k = min(groups_per_batch, len(present))
    per_group = max(1, batch_size // k)

    def batch(generator: torch.Generator) -> list[torch.Tensor]:
        chosen = torch.randperm(len(present), generator=generator)[:k].tolist()
        return [
            torch.cat(
                [members[c][torch.randint(members[c].numel(), (per_group,), generator=generator)] for c in chosen]
            )
        ]

    return BatchStream(batch, generator)
