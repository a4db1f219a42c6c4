"""A training image's random parameters under a paper's protocol, drawn from the run's seeded generator in the
reference's order: the random resized crop by torchvision's rule (its ten attempts and its central fallback
included), the flip, ColorJitter's order and factors, greyscale, the lighting noise; each consuming the generator
exactly as the reference consumes torch's global one, so a seed draws the reference's parameters. And the lighting
noise itself, added on the device to the float batch (:func:`lighting`) as the reference adds it after ``ToTensor``.

The pixels: :mod:`shiftbench.erm.photo_pixels`.
"""

from __future__ import annotations

import functools
import math

import torch

from shiftbench.erm.photo_pixels import Draw
from shiftbench.erm.protocols import PCA_EIGVAL, PCA_EIGVEC, TrainTransform


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return float(torch.empty(1).uniform_(low, high, generator=generator).item())


def crop_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], generator: torch.Generator
) -> tuple[int, int, int, int]:
    """RandomResizedCrop's parameters (top, left, height, width) for an image of ``width`` x ``height``: ten tries
    at an area fraction drawn in ``scale`` and an aspect drawn log-uniformly in ``ratio``, kept once the box fits,
    each try drawing what torchvision's draws in its order; then the central crop of the nearest allowed aspect."""
    area = height * width
    low, high = torch.log(torch.tensor(ratio)).tolist()  # float32 logs, as torchvision takes them
    for _ in range(10):
        target = area * _uniform(scale[0], scale[1], generator)
        aspect = float(torch.exp(torch.empty(1).uniform_(low, high, generator=generator)).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    shape = width / height
    if shape < min(ratio):
        w, h = width, round(width / min(ratio))
    elif shape > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def draw(width: int, height: int, transform: TrainTransform, generator: torch.Generator) -> Draw:
    """One image's parameters, drawn in the reference's order: crop, flip, jitter, greyscale, lighting."""
    box = crop_box(width, height, transform.scale, transform.ratio, generator)
    flip = bool(torch.rand(1, generator=generator).item() < transform.flip)
    order: tuple[int, ...] = ()
    factors: list[float | None] = [None, None, None, None]
    if transform.jitter is not None:
        order = tuple(int(k) for k in torch.randperm(4, generator=generator).tolist())
        ranges = (transform.jitter.brightness, transform.jitter.contrast, transform.jitter.saturation,
                  transform.jitter.hue)  # fmt: skip
        factors = [None if r is None else _uniform(r[0], r[1], generator) for r in ranges]
    grey = bool(torch.rand(1, generator=generator).item() < transform.grey) if transform.grey else False
    alphas = (0.0, 0.0, 0.0)
    if transform.lighting:
        drawn = torch.empty(3).normal_(0, transform.lighting, generator=generator).tolist()
        alphas = (drawn[0], drawn[1], drawn[2])
    return Draw(box, flip, order, (factors[0], factors[1], factors[2], factors[3]), grey, alphas)


@functools.cache
def _pca(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The PCA's eigenvectors and eigenvalues on ``device``, made once (no host copy inside a captured step)."""
    return torch.tensor(PCA_EIGVEC, device=device), torch.tensor(PCA_EIGVAL, device=device)


def lighting_offsets(alphas: torch.Tensor) -> torch.Tensor:
    """AlexNet's PCA lighting noise as a per-channel offset ``[B, 3]`` from each image's three ``alphas`` ``[B, 3]``:
    the eigenvectors weighted by alpha times eigenvalue, summed over the components."""
    eigvec, eigval = _pca(alphas.device)
    return (eigvec.unsqueeze(0) * (alphas * eigval).unsqueeze(1)).sum(2)


def lighting(x: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """Pixels in [0, 1] (``ToTensor``'s) plus each image's lighting offset, unclipped as the reference leaves them."""
    return x + lighting_offsets(alphas.to(x.device, non_blocking=True)).view(-1, 3, 1, 1)
