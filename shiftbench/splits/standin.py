"""Stand-in images for a published split whose real images are not on this machine.

GENERATED, not the dataset's images: one 64x64 PNG per example, drawn with the sprites
rasteriser, in which the *label* sets the shape and its colour and the *group* (BREEDS subclass,
MetaShift community, ConDS cell) sets the background and the size. So a stand-in split keeps the
benchmark's structure (which groups are in train, which only at test) and exercises the whole
training path, from image files on disk to published results, but its accuracies say nothing
about the real dataset. Runs on stand-ins record ``image_source = standin``.
"""

from __future__ import annotations

import colorsys
import hashlib
from pathlib import Path

import polars as pl

from shiftbench.runtime.cache import write_file_atomic
from shiftbench.sources.sprites import IMAGE_SIZE, SHAPES, png_bytes, rasterize

GENERATOR_VERSION = "standin-1"
TEMPLATE = "{}.png"
_GOLDEN = 0.618033988749895


def _unit(*names: str) -> float:
    digest = hashlib.sha256("|".join(names).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _rgb(hue: float, saturation: float, value: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(hue % 1.0, saturation, value)
    return round(r * 255), round(g * 255), round(b * 255)


def standin_png(example_id: str, y: int, group: str) -> bytes:
    shape = SHAPES[y % len(SHAPES)]
    foreground = _rgb((y // len(SHAPES)) * _GOLDEN, 0.9, 0.95)  # label -> distinct saturated hues
    background = _rgb(_unit("background", group), 0.35, 0.55)  # group -> muted background
    scale = 8.0 + 8.0 * _unit("size", group)
    margin = 1.25 * scale + 1.0
    x = margin + (IMAGE_SIZE - 2 * margin) * _unit("x", example_id)
    y_pos = margin + (IMAGE_SIZE - 2 * margin) * _unit("y", example_id)
    angle = 6.283185307179586 * _unit("angle", example_id)
    return png_bytes(rasterize(shape, foreground, background, scale, x, y_pos, angle))


def write_standins(examples: pl.DataFrame, root: Path) -> int:
    """Write ``root/<example_id>.png`` for every example not written yet; returns how many were written."""
    written = 0
    for example_id, y, group in examples.select("example_id", "y", "group").unique("example_id").iter_rows():
        target = root / TEMPLATE.format(example_id)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(target, standin_png(example_id, y, group))
        written += 1
    return written
