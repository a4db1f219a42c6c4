"""GQA-shaped scene graphs for benchmarks: GQA's size and object density, not its content.

Real GQA (train + val) has about 113,000 images with about 16 objects each (1.8 M objects over ~1,700
object names), up to 3 attributes per object, in single JSON documents of hundreds of MB. The MetaShift
fixture has the names and attributes of real Visual Genome objects but only 2.5 objects per image, so the
object-presence collection it gives is small. This generator keeps GQA's shape:

- a vocabulary of ``n_names`` object names (the fixture's 337 real names first, then ``object-<k>``), drawn
  with Zipf frequencies (exponent ``zipf``) reweighted per *scene type* (``n_scenes`` of them, a log-normal
  factor per name and scene), so that objects co-occur in clusters as in real scenes and meta-graphs have
  communities;
- 1 + Poisson(``objects_per_image`` - 1) objects per image, each with 0-3 attributes (probabilities 0.35,
  0.35, 0.2, 0.1) from a Zipf-weighted vocabulary of ``n_attributes`` (the fixture's, then ``attr-<k>``);
- GQA's layout: ``{image_id: {"width", "height", "objects": {object_id: {"name", "x", "y", "w", "h",
  "attributes", "relations"}}}}``, numeric image ids, one document.

Deterministic: the same arguments give the same bytes.

    .venv/bin/python bench/gqa_shaped.py /tmp/gqa/gqa_1x.json --images 113000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

PROJECT = Path(__file__).resolve().parents[1]
FIXTURE = PROJECT.parent / "shared" / "fixtures" / "metashift" / "gqa_scene_graphs_from_attributes.json"
ATTRIBUTE_COUNT_P = (0.35, 0.35, 0.2, 0.1)


def _vocabulary(real: list[str], size: int, prefix: str) -> list[str]:
    real = sorted(set(real))[:size]
    return real + [f"{prefix}-{k}" for k in range(size - len(real))]


def generate(
    path: Path,
    n_images: int = 113_000,
    objects_per_image: float = 16.0,
    n_names: int = 1_700,
    n_attributes: int = 600,
    n_scenes: int = 40,
    zipf: float = 1.0,
    scene_sigma: float = 1.5,
    seed: int = 0,
) -> dict[str, Any]:
    """Write one GQA-layout document and return its counts."""
    fixture = json.loads(FIXTURE.read_text("utf-8")) if FIXTURE.is_file() else {}
    real_names = [o["name"] for g in fixture.values() for o in g["objects"].values()]
    real_attributes = [a for g in fixture.values() for o in g["objects"].values() for a in o.get("attributes") or ()]
    names = _vocabulary(real_names, n_names, "object")
    attributes = _vocabulary(real_attributes, n_attributes, "attr")
    rng = np.random.default_rng(seed)
    rng.shuffle(names)  # which names are frequent does not follow the alphabet
    base = 1.0 / np.arange(1, n_names + 1) ** zipf
    scene_weights = base[None, :] * np.exp(scene_sigma * rng.standard_normal((n_scenes, n_names)))
    scene_cdf = np.cumsum(scene_weights / scene_weights.sum(axis=1, keepdims=True), axis=1)

    counts = 1 + rng.poisson(objects_per_image - 1, n_images)
    n_objects = int(counts.sum())
    image_of = np.repeat(np.arange(n_images), counts)
    scene_of = rng.integers(0, n_scenes, n_images)[image_of]
    draws = rng.random(n_objects)
    name_code = np.empty(n_objects, dtype=np.int64)
    for s in range(n_scenes):  # inverse-CDF sampling per scene type
        mask = scene_of == s
        name_code[mask] = np.minimum(np.searchsorted(scene_cdf[s], draws[mask]), n_names - 1)
    n_attr = rng.choice(len(ATTRIBUTE_COUNT_P), n_objects, p=ATTRIBUTE_COUNT_P)
    attribute_p = 1.0 / np.arange(1, n_attributes + 1) ** zipf
    attribute_code = rng.choice(n_attributes, int(n_attr.sum()), p=attribute_p / attribute_p.sum())

    quoted_names = pl.Series([json.dumps(n) for n in names])
    quoted_attributes = pl.Series([json.dumps(a) for a in attributes])
    attribute_lists = (
        pl.DataFrame({"o": np.repeat(np.arange(n_objects), n_attr), "a": quoted_attributes.gather(attribute_code)})
        .group_by("o", maintain_order=True)
        .agg(pl.col("a").str.join(", "))
    )
    objects = (
        pl.DataFrame({"o": np.arange(n_objects), "image": image_of, "name": quoted_names.gather(name_code)})
        .join(attribute_lists, on="o", how="left", maintain_order="left")
        .select(
            "image",
            pl.concat_str(
                pl.lit('"'),
                (pl.col("o") + 10_000_000).cast(pl.String),
                pl.lit('": {"name": '),
                pl.col("name"),
                pl.lit(', "x": 12, "y": 34, "w": 56, "h": 78, "attributes": ['),
                pl.col("a").fill_null(""),
                pl.lit('], "relations": []}'),
            ).alias("fragment"),
        )
        .group_by("image", maintain_order=True)
        .agg(pl.col("fragment").str.join(", "))
        .select(
            pl.concat_str(
                pl.lit('"'),
                (pl.col("image") + 2_300_000).cast(pl.String),
                pl.lit('": {"width": 640, "height": 480, "objects": {'),
                pl.col("fragment"),
                pl.lit("}}"),
            )
        )
        .to_series()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        handle.write("{")
        for start in range(0, len(objects), 50_000):
            if start:
                handle.write(", ")
            handle.write(", ".join(objects.slice(start, 50_000).to_list()))
        handle.write("}")
    return {"images": n_images, "objects": n_objects, "bytes": path.stat().st_size, "attributes": int(n_attr.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--images", type=int, default=113_000)
    parser.add_argument("--objects-per-image", type=float, default=16.0)
    parser.add_argument("--names", type=int, default=1_700)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(generate(args.path, args.images, args.objects_per_image, args.names, seed=args.seed)))


if __name__ == "__main__":
    main()
