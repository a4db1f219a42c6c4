"""The generated ``sprites`` dataset: dSprites-style 64x64 RGB images with known attributes.

GENERATED, not dSprites: a shape {square, ellipse, heart} in an object colour {red, yellow, blue}
on a background colour {orange, green, purple} at a size {small, middle, big}, at a seeded random
position and rotation; ``n_per_combination`` images for each of the 81 combinations (ConDS
Appendix A.2 colours dSprites the same way). It is the embedded default of the ConDS family and
the image dataset the ERM job trains on in tests.

Deterministic for a seed: each combination draws from its own named generator, shapes are
rasterised in numpy with 4x4 supersampling (anti-aliased edges, no font or renderer
dependency), and Pillow writes the PNGs with fixed settings.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from PIL import Image

from shiftbench.runtime.seeding import rng_for

DATASET = "sprites"
GENERATOR_VERSION = "sprites-generator-1"
IMAGE_SIZE = 64
SHAPES = ("square", "ellipse", "heart")
OBJECT_COLORS = {"red": (220, 38, 38), "yellow": (245, 205, 35), "blue": (37, 85, 225)}
BACKGROUND_COLORS = {"orange": (245, 145, 60), "green": (55, 160, 80), "purple": (125, 65, 165)}
SIZES = {"small": 8.0, "middle": 12.0, "big": 16.0}  # half-extent in pixels
ATTRIBUTES = ("shape", "object_color", "background_color", "size")
_SUPERSAMPLE = 4
_REACH = 1.25  # every shape lies within this many half-extents of its centre, at any angle


@dataclass(frozen=True)
class Sprite:
    shape: str
    object_color: str
    background_color: str
    size: str
    x: float
    y: float
    angle: float


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Membership of unit-scale points (shape centred at 0, extent about 1)."""
    inside: np.ndarray
    if shape == "square":
        inside = np.maximum(np.abs(u), np.abs(v)) <= 0.8
        return inside
    if shape == "ellipse":
        inside = u**2 + (v / 0.55) ** 2 <= 1.0
        return inside
    # heart: (x^2 + y^2 - 1)^3 - x^2 y^3 <= 0, y pointing up, scaled to fit [-1, 1]
    x, y = u * 1.15, -v * 1.15 + 0.15
    inside = (x * x + y * y - 1) ** 3 - x * x * y**3 <= 0
    return inside


def render(sprite: Sprite) -> np.ndarray:
    """One image as an (64, 64, 3) uint8 array (only the shape's bounding window is supersampled)."""
    return rasterize(
        sprite.shape,
        OBJECT_COLORS[sprite.object_color],
        BACKGROUND_COLORS[sprite.background_color],
        SIZES[sprite.size],
        sprite.x,
        sprite.y,
        sprite.angle,
    )


def rasterize(
    shape: str,
    foreground: tuple[int, int, int],
    background: tuple[int, int, int],
    scale: float,
    x: float,
    y: float,
    angle: float,
) -> np.ndarray:
    """A shape of half-extent ``scale`` centred at (x, y), rotated by ``angle``, on a plain background."""
    reach = _REACH * scale
    top, left = (max(0, int(np.floor(c - reach))) for c in (y, x))
    bottom, right = (min(IMAGE_SIZE, int(np.ceil(c + reach))) for c in (y, x))
    rows = top + (np.arange((bottom - top) * _SUPERSAMPLE) + 0.5) / _SUPERSAMPLE
    cols = left + (np.arange((right - left) * _SUPERSAMPLE) + 0.5) / _SUPERSAMPLE
    py, px = np.meshgrid(rows, cols, indexing="ij")
    dx, dy = px - x, py - y
    cos, sin = np.cos(angle), np.sin(angle)
    u = (cos * dx + sin * dy) / scale
    v = (-sin * dx + cos * dy) / scale
    hit = _inside(shape, u, v).astype(np.float64)
    coverage = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 1))
    window = hit.reshape(bottom - top, _SUPERSAMPLE, right - left, _SUPERSAMPLE).mean(axis=(1, 3))
    coverage[top:bottom, left:right, 0] = window
    fg = np.array(foreground, dtype=np.float64)
    bg = np.array(background, dtype=np.float64)
    return np.rint(coverage * fg + (1 - coverage) * bg).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def sprites(n_per_combination: int, seed: int) -> list[tuple[str, Sprite]]:
    """(example id, sprite) for every image, combinations in a fixed order."""
    result: list[tuple[str, Sprite]] = []
    for combination in itertools.product(SHAPES, OBJECT_COLORS, BACKGROUND_COLORS, SIZES):
        rng = rng_for(seed, DATASET, *combination)
        margin = _REACH * SIZES[combination[3]] + 1.0  # whole shape inside the image
        xy = rng.uniform(margin, IMAGE_SIZE - margin, size=(n_per_combination, 2))
        angles = rng.uniform(0.0, 2 * np.pi, size=n_per_combination)
        for k in range(n_per_combination):
            sprite = Sprite(*combination, x=float(xy[k, 0]), y=float(xy[k, 1]), angle=float(angles[k]))
            result.append((f"sprite_{len(result):06d}", sprite))
    return result


def attribute_frame(items: list[tuple[str, Sprite]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "example_id": [i for i, _ in items],
            **{a: [getattr(s, a) for _, s in items] for a in ATTRIBUTES},
            "x": [s.x for _, s in items],
            "y": [s.y for _, s in items],
            "angle": [s.angle for _, s in items],
            "image": [f"images/{i}.png" for i, _ in items],
        }
    )


def write_sprites(directory: Path, n_per_combination: int, seed: int) -> pl.DataFrame:
    """PNG files under ``directory/images/`` and ``directory/attributes.parquet``; returns the table."""
    items = sprites(n_per_combination, seed)
    (directory / "images").mkdir(parents=True, exist_ok=True)
    for example_id, sprite in items:
        (directory / "images" / f"{example_id}.png").write_bytes(png_bytes(render(sprite)))
    table = attribute_frame(items)
    table.write_parquet(directory / "attributes.parquet")
    return table
