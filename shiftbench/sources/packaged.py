"""Derived data shipped with the package, so the defaults are the papers' benchmarks offline.

- ``data/breeds_calibration.edits``: the edit file (:mod:`shiftbench.sources.calibration`) that turns WordNet
  3.0, restricted to the ancestors of the 1000 ImageNet classes, into exactly the BREEDS calibrated
  hierarchy (BREEDS-Benchmarks, MIT: ``data/LICENSE-BREEDS``).
- ``data/metashift_attributes.parquet``: MetaShift's released attribute annotations, one row per
  (Visual Genome image, subject object) with its attributes (CC BY 4.0: ``data/LICENSE-METASHIFT``).

Both are produced by ``scripts/make_package_data.py`` from the released files; tests prove that
WordNet plus the edits is the release's hierarchy and that the attribute collection built from
the Parquet file is the released subsets, exactly.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from shiftbench.sources.scene_graphs import SceneTables
from shiftbench.tables.fingerprint import sha256_file

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
BREEDS_CALIBRATION = DATA_DIR / "breeds_calibration.edits"
METASHIFT_ATTRIBUTES = DATA_DIR / "metashift_attributes.parquet"
METASHIFT_KIND = "metashift-released-attributes"


def metashift_attribute_objects(subsets: pl.DataFrame) -> pl.DataFrame:
    """Released ``subset, subject, attribute, image_id`` rows -> one object per (image, subject)."""
    return (
        subsets.group_by("image_id", "subject")
        .agg(pl.col("attribute").unique().sort().alias("attributes"))
        .rename({"subject": "name"})
        .sort("image_id", "name")
        .with_columns(pl.col("name").alias("object_id"))  # one object per subject and image
        .select("image_id", "object_id", "name", "attributes")
    )


def metashift_scene_tables(path: Path = METASHIFT_ATTRIBUTES) -> SceneTables:
    """The packaged annotations as scene tables (no image-level location, weather or tags)."""
    objects = pl.read_parquet(path)
    images = (
        objects.select("image_id")
        .unique()
        .with_columns(
            pl.lit(None, pl.String).alias("location"),
            pl.lit(None, pl.String).alias("weather"),
            pl.lit([], dtype=pl.List(pl.String)).alias("general"),
        )
    )
    return SceneTables.from_frames(objects, images, sha256_file(path), kind=METASHIFT_KIND)
