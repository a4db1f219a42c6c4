"""Open-Images-shaped tag tables for benchmarks: ``image_id, tag`` rows, Zipf-distributed tags.

Open Images V7 has about 9 M images with image-level labels over a vocabulary of about 20,000 classes, about 16.7
labels per image (150 M rows), and 1.9 M images with boxes over 600 "boxable" classes (about 7.5 classes an
image). This writes the same shapes at any size: each image gets 1 + Poisson(``tags_per_image`` - 1) tags drawn
with Zipf frequencies (exponent ``zipf``) from ``n_tags`` names (``tag-<k>``, most frequent first), distinct
within an image, as Parquet written in row groups of whole images (never the whole table in memory; ``kind`` left
out: every tag is an object tag, so it is both a class and an object context). Deterministic for a given seed.

Shapes (``--shape``):

- ``boxable``: 1.9 M images, 8.45 drawn tags each over 600 classes: 14.3 M distinct (image, class) rows;
- ``image-level``: 9 M images, 18.6 drawn tags each over 20,000: 150 M distinct rows (16.7 an image); with
  ``--classes-file`` it also writes the study's class list, the 600 most frequent tags (Open Images' boxable
  classes are among its frequent labels).

    .venv/bin/python bench/tag_table.py /tmp/oi/boxable.parquet --shape boxable
    .venv/bin/python bench/tag_table.py /tmp/oi/image_level.parquet --shape image-level \
        --classes-file /tmp/oi/classes.txt
    .venv/bin/python bench/tag_table.py /tmp/tags.parquet --images 200000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

SHAPES: dict[str, dict[str, Any]] = {
    "boxable": {"n_images": 1_900_000, "tags_per_image": 8.45, "n_tags": 600},
    "image-level": {"n_images": 9_000_000, "tags_per_image": 18.6, "n_tags": 20_000},
}
CHUNK_IMAGES = 500_000


def generate(
    path: Path,
    n_images: int,
    tags_per_image: float = 16.7,
    n_tags: int = 20_000,
    zipf: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_tags + 1) ** zipf
    cdf = np.cumsum(weights / weights.sum())
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    seen = np.zeros(n_tags, dtype=bool)
    writer: pq.ParquetWriter | None = None
    width = len(str(n_images - 1))
    for first in range(0, n_images, CHUNK_IMAGES):
        count = min(CHUNK_IMAGES, n_images - first)
        per_image = 1 + rng.poisson(tags_per_image - 1, count)
        image = np.repeat(np.arange(first, first + count, dtype=np.int64), per_image)
        tag = np.minimum(np.searchsorted(cdf, rng.random(len(image))), n_tags - 1)
        frame = (
            pl.DataFrame({"image": image, "tag": tag})
            .unique()  # distinct tags per image, as image-level labels are
            .sort("image", "tag")
        )
        seen[frame["tag"].unique().to_numpy()] = True
        table = frame.select(
            pl.format("oi-{}", pl.col("image").cast(pl.String).str.zfill(width)).alias("image_id"),
            pl.format("tag-{}", pl.col("tag")).alias("tag"),
        ).to_arrow()
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table)
        rows += frame.height
    if writer is not None:
        writer.close()
    return {"images": n_images, "rows": rows, "tags": int(seen.sum()), "bytes": path.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="Open Images' boxable or image-level shape")
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--tags-per-image", type=float, default=16.7)
    parser.add_argument("--tags", type=int, default=20_000)
    parser.add_argument("--classes-file", type=Path, help="also write the 600 most frequent tags, one per line")
    args = parser.parse_args()
    shape = SHAPES[args.shape] if args.shape else {}
    result = generate(
        args.path,
        shape.get("n_images", args.images),
        shape.get("tags_per_image", args.tags_per_image),
        shape.get("n_tags", args.tags),
    )
    if args.classes_file is not None:
        args.classes_file.write_text("".join(f"tag-{k}\n" for k in range(600)), "utf-8")
        result["classes_file"] = str(args.classes_file)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
