"""An Open-Images-shaped tag table for benchmarks: ``image_id, tag`` rows, Zipf-distributed tags.

Open Images V7 has about 9 M images with image-level labels over a vocabulary of about 20,000 classes,
about 16.7 labels per image (150 M rows). This writes the same shape at any number of images: each image
gets 1 + Poisson(``tags_per_image`` - 1) distinct tags drawn with Zipf frequencies (exponent ``zipf``)
from ``n_tags`` names (``tag-<k>``), as Parquet (``kind`` left out: every tag is an object tag, so it is
both a class and an object context). Deterministic for a given seed.

    .venv/bin/python bench/tag_table.py /tmp/tags.parquet --images 200000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl


def generate(
    path: Path, n_images: int, tags_per_image: float = 16.7, n_tags: int = 20_000, zipf: float = 1.0, seed: int = 0
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    counts = 1 + rng.poisson(tags_per_image - 1, n_images)
    weights = 1.0 / np.arange(1, n_tags + 1) ** zipf
    cdf = np.cumsum(weights / weights.sum())
    image = np.repeat(np.arange(n_images, dtype=np.int64), counts)
    tag = np.minimum(np.searchsorted(cdf, rng.random(len(image))), n_tags - 1)
    frame = (
        pl.DataFrame({"image": image, "tag": tag})
        .unique()  # distinct tags per image, as image-level labels are
        .sort("image", "tag")
        .select(
            pl.format("oi-{}", pl.col("image").cast(pl.String).str.zfill(8)).alias("image_id"),
            pl.format("tag-{}", pl.col("tag")).alias("tag"),
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path, compression="zstd")
    return {
        "images": n_images,
        "rows": frame.height,
        "tags": int(frame["tag"].n_unique()),
        "bytes": path.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--tags-per-image", type=float, default=16.7)
    parser.add_argument("--tags", type=int, default=20_000)
    args = parser.parse_args()
    print(json.dumps(generate(args.path, args.images, args.tags_per_image, args.tags)))


if __name__ == "__main__":
    main()
