"""Random label-preserving transforms of a uint8 ``[B, C, H, W]`` batch, every image with its own draws.

Split in two so that a training step can be captured in a CUDA graph: :func:`draw` makes a batch's
random numbers on the host from a seeded CPU generator (a few numbers per image, so a seed gives the
same run on any device), and :func:`apply` turns them into pixels on the batch's device with no host
synchronisation and fixed shapes. :func:`augment` is the two in one call.

``flip_rot90``: each image is flipped horizontally with probability 1/2 and turned by a uniformly drawn
multiple of 90 degrees (the dihedral group of the square: lossless on square images, no interpolation).

``domainbed``: DomainBed's training transform (MetaShift Section 4 follows it): RandomResizedCrop
(scale 0.7-1, aspect 3/4-4/3, back to the input size), horizontal flip (p 1/2), ColorJitter 0.3
(brightness, contrast, saturation, hue) and greyscale (p 0.1). Written here because torchvision's v2
transforms draw one set of parameters per call (a batch would share one crop) and torchvision does not
import beside the CPU torch wheel (BENCHMARKS.md, "Training on CPU"). Crop and flip are one affine
resampling (``grid_sample``, bilinear). The jitter factors are applied in a fixed order (torchvision
permutes them per call), and hue is turned in YIQ space, a linear stand-in for torchvision's HSV round
trip.

``imagenet``, ``randaugment``, ``autoaugment`` and ``augmix``: the ConDS paper's four augmentations,
:mod:`shiftbench.erm.policies`.
"""

from __future__ import annotations

import functools
import math

import torch

from shiftbench.erm import policies
from shiftbench.erm.config import AUGMENTATIONS

assert set(AUGMENTATIONS) == {"none", "flip_rot90", "domainbed", *policies.POLICIES}, "config lists every kind"
# The uniform ranges of DomainBed's draws, in the order they are drawn (one row of draws each).
_DOMAINBED_RANGES = (
    (0.7, 1.0),  # crop area
    (math.log(3 / 4), math.log(4 / 3)),  # log aspect ratio
    (0.0, 1.0),  # crop centre x
    (0.0, 1.0),  # crop centre y
    (0.0, 1.0),  # flip (< 0.5)
    (0.7, 1.3),  # brightness
    (0.7, 1.3),  # contrast
    (0.7, 1.3),  # saturation
    (-0.3, 0.3),  # hue, in turns
    (0.0, 1.0),  # greyscale (< 0.1)
)
# RGB -> YIQ and back: hue turns rotate the chroma plane (I, Q) and leave luma (Y) alone.
_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
_GREY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as Pillow and torchvision convert to L


def draw(kind: str, n: int, generator: torch.Generator, *, size: int) -> torch.Tensor:
    """The random numbers of ``n`` images of ``size`` pixels a side, float32 ``[rows, n]`` on the host
    (no rows for ``none``)."""
    if kind in policies.POLICIES:
        return policies.draw(kind, n, size, generator)
    if kind == "none":
        return torch.zeros(0, n)
    if kind == "flip_rot90":
        flips = torch.rand(n, generator=generator)
        turns = torch.randint(0, 4, (n,), generator=generator)
        return torch.stack([flips, turns.float()])
    if kind == "domainbed":
        return torch.stack([low + (high - low) * torch.rand(n, generator=generator) for low, high in _DOMAINBED_RANGES])
    raise ValueError(f"unknown augmentation {kind!r}")


def apply(batch: torch.Tensor, kind: str, draws: torch.Tensor) -> torch.Tensor:
    """The transformed batch (uint8, same shape) on the batch's device; ``draws`` from :func:`draw`."""
    if kind == "none":
        return batch
    draws = draws.to(batch.device, non_blocking=True)
    if kind in policies.POLICIES:
        return policies.apply(batch, kind, draws)
    if kind == "flip_rot90":
        return _flip_rot90(batch, draws)
    return _domainbed(batch, draws)


def augment(batch: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """:func:`draw` then :func:`apply`: the eager step's path."""
    return apply(batch, kind, draw(kind, batch.shape[0], generator, size=batch.shape[-1]))


def _flip_rot90(batch: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Every image's turn selected elementwise from the four turns of the batch: fixed shapes, no sync."""
    flips, turns = draws[0] < 0.5, draws[1].long()
    out = torch.where(flips.view(-1, 1, 1, 1), batch.flip(-1), batch)
    rotated = out
    for k in (1, 2, 3):
        rotated = torch.where((turns == k).view(-1, 1, 1, 1), torch.rot90(out, k, dims=(-2, -1)), rotated)
    return rotated


@functools.cache
def _colour_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """YIQ, its inverse and the luma weights on ``device``, made once (no host copy inside a step)."""
    yiq = torch.tensor(_YIQ)
    return yiq.to(device), torch.linalg.inv(yiq).to(device), torch.tensor(_GREY, device=device).view(1, 3, 1, 1)


def _domainbed(batch: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    n, _, h, w = batch.shape
    area, log_ratio, at_x, at_y, flip_draw, brightness, contrast, saturation, hue_turns, grey_draw = draws.unbind(0)
    ratio = torch.exp(log_ratio)
    crop_w = torch.sqrt(area * ratio).clamp(max=1.0)  # fractions of the width and height
    crop_h = torch.sqrt(area / ratio).clamp(max=1.0)
    centre_x = (at_x * (1 - crop_w) + crop_w / 2) * 2 - 1  # in grid coordinates (-1, 1)
    centre_y = (at_y * (1 - crop_h) + crop_h / 2) * 2 - 1
    flip = torch.where(flip_draw < 0.5, -1.0, 1.0)
    zero = torch.zeros_like(area)
    theta = torch.stack([crop_w * flip, zero, centre_x, zero, crop_h, centre_y], 1).view(n, 2, 3)
    x = batch.float().div_(255.0)
    grid = torch.nn.functional.affine_grid(theta, [n, 3, h, w], align_corners=False)
    x = torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)

    to_yiq, from_yiq, grey_weights = _colour_constants(batch.device)
    hue = hue_turns * 2 * math.pi
    x = (x * brightness.view(-1, 1, 1, 1)).clamp_(0, 1)
    mean = (x * grey_weights).sum(1, keepdim=True).mean((2, 3), keepdim=True)
    x = ((x - mean) * contrast.view(-1, 1, 1, 1) + mean).clamp_(0, 1)
    grey = (x * grey_weights).sum(1, keepdim=True)
    x = ((x - grey) * saturation.view(-1, 1, 1, 1) + grey).clamp_(0, 1)
    yiq = torch.einsum("ij,bjhw->bihw", to_yiq, x)
    cos, sin = torch.cos(hue).view(-1, 1, 1), torch.sin(hue).view(-1, 1, 1)
    i, q = yiq[:, 1], yiq[:, 2]
    yiq = torch.stack([yiq[:, 0], cos * i - sin * q, sin * i + cos * q], 1)
    x = torch.einsum("ij,bjhw->bihw", from_yiq, yiq).clamp_(0, 1)
    to_grey = (grey_draw < 0.1).view(-1, 1, 1, 1)
    x = torch.where(to_grey, (x * grey_weights).sum(1, keepdim=True).expand_as(x), x)
    return x.mul_(255.0).round_().to(torch.uint8)
