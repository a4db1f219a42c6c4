"""The papers' image protocols (:mod:`shiftbench.erm.protocols`) on photographs, pixel for pixel as their reference
implementations (torchvision's transforms on Pillow images, which the robustness library and DomainBed compose).

Reading (:func:`open_photo`) is ImageNet's loaders' (Pillow, converted to RGB, EXIF orientation not applied), with
guards: an empty, truncated or unreadable file, an image with a side under :data:`MIN_SIDE` pixels and one of more
than :data:`MAX_PIXELS` pixels (a decompression bomb) are one line naming the file (:class:`InputError`). The
reference loaders accept a truncated JPEG (DomainBed sets ``LOAD_TRUNCATED_IMAGES``): a run here names it instead.

Evaluation (:func:`eval_pixels`) is deterministic. Training is in two steps so that a run's random numbers come from
its own seeded generator in the reference's order: :func:`draw` makes one image's parameters (the random resized crop
by torchvision's rule, its ten attempts and its central fallback included; the flip; ColorJitter's order and factors;
greyscale; the lighting noise), consuming the generator exactly as the reference consumes torch's global one, and
:func:`train_pixels` applies them with Pillow as torchvision does. The lighting noise is added on the device, on the
float batch (:func:`lighting`), as the reference adds it after ``ToTensor``.

Pillow, numpy and torch only: the training job imports this.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageEnhance, UnidentifiedImageError

from shiftbench.erm.protocols import PCA_EIGVAL, PCA_EIGVEC, Protocol, TrainTransform
from shiftbench.errors import InputError

MIN_SIDE = 8  # pixels: smaller is no photograph a crop can be taken from
MAX_PIXELS = 89_478_485  # Pillow's decompression-bomb threshold (a 30,000 x 30,000 image is ten times more)
BILINEAR = Image.Resampling.BILINEAR


def open_photo(path: Path) -> Image.Image:
    """The image at ``path``, decoded and converted to RGB, or one line naming the file."""
    try:
        if path.stat().st_size == 0:
            raise InputError("empty image file (0 bytes)", path=path)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise InputError(
                        f"image of {width:,} x {height:,} pixels, more than {MAX_PIXELS:,}: refused (a decompression "
                        "bomb?)",
                        path=path,
                    )
                if min(width, height) < MIN_SIDE:
                    raise InputError(f"image of {width} x {height} pixels: under {MIN_SIDE} on a side", path=path)
                return image.convert("RGB")  # decodes the whole file: a truncated one raises here
    except FileNotFoundError:
        raise InputError("image file not found", path=path) from None
    except UnidentifiedImageError:
        raise InputError("not an image Pillow can read", path=path) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(
            f"image of more than {MAX_PIXELS:,} pixels: refused (a decompression bomb?)", path=path
        ) from None
    except OSError as exc:
        raise InputError(f"cannot decode image: {exc}", path=path) from None


def to_array(image: Image.Image) -> np.ndarray:
    """An RGB image as uint8 ``[3, H, W]``."""
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)


# -- evaluation --------------------------------------------------------------------------------------------------


def shorter_side_to(image: Image.Image, side: int) -> Image.Image:
    """Resize(side) on a Pillow image: the shorter side to ``side``, the longer by the same factor, truncated."""
    width, height = image.size
    size = (side, int(side * height / width)) if width <= height else (int(side * width / height), side)
    return image.resize(size, BILINEAR)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """CenterCrop(size) of an image at least ``size`` on both sides (offsets rounded half to even, as Python rounds)."""
    width, height = image.size
    top, left = round((height - size) / 2.0), round((width - size) / 2.0)
    return image.crop((left, top, left + size, top + size))


def eval_image(image: Image.Image, protocol: Protocol, size: int) -> Image.Image:
    """The protocol's evaluation transform (before ``ToTensor``)."""
    if protocol.eval.resize == "square":
        return image.resize((size, size), BILINEAR)
    return center_crop(shorter_side_to(image, protocol.eval_resize(size)), size)


def eval_pixels(image: Image.Image, protocol: Protocol, size: int) -> np.ndarray:
    return to_array(eval_image(image, protocol, size))


# -- training: the draws -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """One training image's random parameters, in the reference's terms."""

    box: tuple[int, int, int, int]  # top, left, height, width of the crop
    flip: bool
    order: tuple[int, ...]  # ColorJitter's: 0 brightness, 1 contrast, 2 saturation, 3 hue
    factors: tuple[float | None, float | None, float | None, float | None]
    grey: bool
    alphas: tuple[float, float, float]  # the lighting noise's (zeros without it)


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


# -- training: the pixels ----------------------------------------------------------------------------------------


def _hue(image: Image.Image, factor: float) -> Image.Image:
    """Hue turned by ``factor`` of a full turn: the H channel of Pillow's HSV shifted, wrapping around."""
    h, s, v = image.convert("HSV").split()
    shifted = (np.asarray(h, dtype=np.uint8) + np.uint8(np.int32(factor * 255) & 0xFF)).astype(np.uint8)
    return Image.merge("HSV", (Image.fromarray(shifted, "L"), s, v)).convert("RGB")


def _jitter(image: Image.Image, sample: Draw) -> Image.Image:
    for kind in sample.order:
        factor = sample.factors[kind]
        if factor is None:
            continue
        if kind == 0:
            image = ImageEnhance.Brightness(image).enhance(factor)
        elif kind == 1:
            image = ImageEnhance.Contrast(image).enhance(factor)
        elif kind == 2:
            image = ImageEnhance.Color(image).enhance(factor)
        else:
            image = _hue(image, factor)
    return image


def train_image(image: Image.Image, sample: Draw, size: int) -> Image.Image:
    """The training transform with ``sample``'s parameters, up to (not including) the lighting noise."""
    top, left, h, w = sample.box
    out = image.crop((left, top, left + w, top + h)).resize((size, size), BILINEAR)
    if sample.flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out = _jitter(out, sample)
    if sample.grey:
        out = out.convert("L").convert("RGB")
    return out


def train_pixels(image: Image.Image, sample: Draw, size: int) -> np.ndarray:
    return to_array(train_image(image, sample, size))


def lighting_offsets(alphas: torch.Tensor) -> torch.Tensor:
    """AlexNet's PCA lighting noise as a per-channel offset ``[B, 3]`` from each image's three ``alphas`` ``[B, 3]``:
    the eigenvectors weighted by alpha times eigenvalue, summed over the components."""
    eigvec = torch.tensor(PCA_EIGVEC, device=alphas.device)
    eigval = torch.tensor(PCA_EIGVAL, device=alphas.device)
    return (eigvec.unsqueeze(0) * (alphas * eigval).unsqueeze(1)).sum(2)


def lighting(x: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """Pixels in [0, 1] (``ToTensor``'s) plus each image's lighting offset, unclipped as the reference leaves them."""
    return x + lighting_offsets(alphas.to(x.device, non_blocking=True)).view(-1, 3, 1, 1)
