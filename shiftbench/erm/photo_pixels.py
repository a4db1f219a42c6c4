"""The papers' image protocols (:mod:`shiftbench.erm.protocols`) on photographs, pixel for pixel as their reference
implementations (torchvision's transforms on Pillow images, which the robustness library and DomainBed compose).

Reading (:func:`open_photo`) is ImageNet's loaders' (Pillow, converted to RGB, EXIF orientation not applied), with
guards: an empty, truncated or unreadable file, an image with a side under :data:`MIN_SIDE` pixels and one of more
than :data:`MAX_PIXELS` pixels (a decompression bomb) are one line naming the file (:class:`InputError`). The
reference loaders accept a truncated JPEG (DomainBed sets ``LOAD_TRUNCATED_IMAGES``): a run here names it instead.

Evaluation (:func:`eval_pixels`) is deterministic; training applies one image's :class:`Draw` (its random parameters,
drawn by :mod:`shiftbench.erm.photo_draws` from the run's generator) with Pillow as torchvision does
(:func:`train_pixels`). Pillow and numpy only: the training job's worker processes import this and nothing heavier.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, UnidentifiedImageError

from shiftbench.erm.protocols import Protocol
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


# -- training --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """One training image's random parameters, in the reference's terms."""

    box: tuple[int, int, int, int]  # top, left, height, width of the crop
    flip: bool
    order: tuple[int, ...]  # ColorJitter's: 0 brightness, 1 contrast, 2 saturation, 3 hue
    factors: tuple[float | None, float | None, float | None, float | None]
    grey: bool
    alphas: tuple[float, float, float]  # the lighting noise's (zeros without it)


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


def crop_resize(image: Image.Image, sample: Draw, size: int) -> Image.Image:
    """RandomResizedCrop's pixels: ``sample``'s box cut out, then resized to ``size`` x ``size``."""
    top, left, h, w = sample.box
    return image.crop((left, top, left + w, top + h)).resize((size, size), BILINEAR)


def finish(image: Image.Image, sample: Draw) -> Image.Image:
    """What follows the crop: the flip, the colour jitter in its drawn order, greyscale."""
    if sample.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = _jitter(image, sample)
    if sample.grey:
        image = image.convert("L").convert("RGB")
    return image


def train_image(image: Image.Image, sample: Draw, size: int) -> Image.Image:
    """The training transform with ``sample``'s parameters, up to (not including) the lighting noise."""
    return finish(crop_resize(image, sample, size), sample)


def train_pixels(image: Image.Image, sample: Draw, size: int) -> np.ndarray:
    return to_array(train_image(image, sample, size))
