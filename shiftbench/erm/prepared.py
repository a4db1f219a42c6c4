"""A prepared copy of a run's training photographs: decoded once into one memory-mappable file, so that a training
batch is cropped and jittered from pixels in memory instead of decoding a JPEG per image (FFCV's idea).

Layout of a prepared folder (``<home>/cache/prepared/<key>/``):

- ``pixels.u8``: every image's RGB pixels (height x width x 3, uint8), one after the other;
- ``index.npy``: per image its byte offset, stored height and width, and the original width and height;
- ``prepared.json``: the format, what was prepared (the key's parts), the count, bytes and seconds it took.

``side``: 0 keeps each photograph at its own resolution (the crops are the reference's, pixel for pixel); N stores
it with its shorter side at most N (aspect ratio kept; Pillow's bilinear resize, as torchvision's Resize(N)): a crop
drawn on the original size is then cut from the smaller copy at the same place (a fractional box), so the draws
stay the reference's and only the source resolution differs.

The key is the images' identity (the split version, the image root inside or outside the warehouse, the template,
the rows) and a stamp of the files (names, sizes and modification times: a cache key only, never part of a version
id): a changed split, protocol side or file makes another folder. Written into a temporary folder and renamed into
place (an interrupted preparation leaves nothing that is read); two runs preparing the same key at once each write
their own and the second rename finds the first's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from shiftbench.erm import photo_pixels as pt

FORMAT = 1
PIXELS, INDEX, RECORD = "pixels.u8", "index.npy", "prepared.json"


def stamp(paths: Sequence[Path]) -> str:
    """The files' names, sizes and modification times, hashed: whether a prepared copy is still theirs."""
    digest = hashlib.sha256()
    for path in paths:
        info = path.stat()
        digest.update(f"{path.name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def prepared_key(identity: dict[str, object], paths: Sequence[Path], side: int) -> str:
    text = json.dumps({"format": FORMAT, "side": side, "images": identity, "stamp": stamp(paths)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _stored(path: Path, side: int) -> tuple[np.ndarray, tuple[int, int]]:
    image = pt.open_photo(path)
    original = image.size
    if side and min(original) > side:
        image = pt.shorter_side_to(image, side)
    return np.asarray(image, dtype=np.uint8), original


@dataclass
class PreparedImages:
    """A prepared folder, opened: images by position, as Pillow images of their stored pixels."""

    folder: Path
    index: np.ndarray  # [N, 5] int64: offset, stored height, stored width, original width, original height
    pixels: np.ndarray  # the memory map of pixels.u8

    @classmethod
    def open(cls, folder: Path) -> PreparedImages:
        index = np.load(folder / INDEX)
        size = int(index[-1, 0] + index[-1, 1] * index[-1, 2] * 3) if len(index) else 0
        pixels = np.memmap(folder / PIXELS, dtype=np.uint8, mode="r", shape=(max(size, 1),))
        return cls(folder, index, pixels)

    def original_size(self, position: int) -> tuple[int, int]:
        return int(self.index[position, 3]), int(self.index[position, 4])

    def image(self, position: int) -> Image.Image:
        offset, height, width = (int(v) for v in self.index[position, :3])
        array = self.pixels[offset : offset + height * width * 3].reshape(height, width, 3)
        return Image.fromarray(np.ascontiguousarray(array), "RGB")


def prepare(
    paths: Sequence[Path], folder: Path, side: int, workers: int, record: dict[str, object],
    log: Callable[[str], None] = lambda _: None,
) -> PreparedImages:  # fmt: skip
    """The prepared copy of ``paths`` at ``folder``: opened when it is there, else written (atomically) and opened."""
    if (folder / RECORD).is_file():
        return PreparedImages.open(folder)
    started = time.perf_counter()
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    index = np.zeros((len(paths), 5), dtype=np.int64)
    offset = 0
    with (partial / PIXELS).open("wb") as sink, ThreadPoolExecutor(max_workers=workers) as pool:
        for position, (array, original) in enumerate(pool.map(lambda p: _stored(p, side), paths)):
            index[position] = (offset, array.shape[0], array.shape[1], original[0], original[1])
            sink.write(array.tobytes())
            offset += array.size
    np.save(partial / INDEX, index)
    seconds = time.perf_counter() - started
    facts = {"format": FORMAT, "side": side, "images": len(paths), "bytes": offset, "seconds": round(seconds, 3)}
    (partial / RECORD).write_text(json.dumps({**record, **facts}, indent=1, sort_keys=True), "utf-8")
    try:
        partial.replace(folder)
    except OSError:  # another run prepared the same images first: theirs is the same
        shutil.rmtree(partial, ignore_errors=True)
    log(
        f"prepared {len(paths):,} training images in {seconds:.1f}s: {offset / max(len(paths), 1) / 1024:,.0f} KiB "
        f"an image (side {side or 'as taken'}), {folder}"
    )
    return PreparedImages.open(folder)


def crop_from(image: Image.Image, original: tuple[int, int], sample: pt.Draw, size: int) -> Image.Image:
    """``sample``'s crop (drawn on the ``original`` width and height) cut from a stored copy of another size at the
    same place, resized to ``size``: the reference's crop exactly when the copy is the original."""
    if image.size == original:
        return pt.crop_resize(image, sample, size)
    top, left, h, w = sample.box
    scale_x, scale_y = image.size[0] / original[0], image.size[1] / original[1]
    box = (left * scale_x, top * scale_y, (left + w) * scale_x, (top + h) * scale_y)
    return image.resize((size, size), pt.BILINEAR, box=box)
