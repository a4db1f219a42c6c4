"""The ConDS build as steps over settings: each Dagster asset calls one of these.

A dataset's attribute table (CelebA, the generated sprites with their PNG files, or a user's
table) is read once into a content-addressed cache directory; every case reads it from there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.cache import CachedArtifact, publish_cache_dir
from shiftbench.conds import build
from shiftbench.conds.attributes import attribute_table
from shiftbench.conds.specs import CaseSpec, DatasetSpec
from shiftbench.errors import InputError
from shiftbench.fingerprint import sha256_files, sha256_table, sha256_text
from shiftbench.plots import conds_cell_counts, conds_value_shares
from shiftbench.publishing import environment
from shiftbench.settings import Settings
from shiftbench.sources import sprites
from shiftbench.sources.attribute_tables import read_attribute_table
from shiftbench.sources.celeba import ATTRIBUTE_FILE, read_celeba_attributes
from shiftbench.store import StagedVersion, Store, check_benchmark_name

# Bump when a change to the ConDS builders can change their output.
CODE_VERSION = "conds-1"
# How an example id becomes an image path under the dataset's image root.
EXAMPLE_PATHS = {"celeba": "img_align_celeba/{}", "sprites": "images/{}.png"}
CELL_FIGURE = "cell_counts.png"
SHARES_FIGURE = "value_shares.png"


def _raw_table(
    settings: Settings, dataset: DatasetSpec
) -> tuple[pl.DataFrame, dict[str, Any], Path | None, int | None]:
    """The raw table with ``example_id``, where it came from, the image root, the file line of row 0."""
    if dataset.source == "celeba":
        if settings.celeba_dir is None:
            raise InputError(f"dataset {dataset.name} needs CelebA's annotations", parameter="SHIFTBENCH_CELEBA_DIR")
        path = settings.celeba_dir / ATTRIBUTE_FILE
        celeba = read_celeba_attributes(path, allow_partial=settings.celeba_allow_partial)
        origin = {
            "path": str(path),
            "files_sha256": sha256_files([path]),
            "header_count": celeba.header_count,
            "partial": celeba.partial,
        }
        return celeba.table.rename({"image_id": "example_id"}), origin, settings.celeba_dir, 3
    if dataset.source == "sprites":
        n, seed = settings.sprites_per_combination, settings.sprites_seed
        key = sha256_text(f"{sprites.GENERATOR_VERSION}|{n}|{seed}")[:32]
        target = settings.cache_dir / "sprites" / key

        def generate(tmp: Path) -> None:
            sprites.write_sprites(tmp, n, seed)

        publish_cache_dir(target, generate)
        origin = {"generator": sprites.GENERATOR_VERSION, "n_per_combination": n, "seed": seed, "note": "generated"}
        return pl.read_parquet(target / "attributes.parquet"), origin, target, None
    assert dataset.path is not None
    frame, first_line = read_attribute_table(dataset.path, dataset.id_column)
    return frame, {"path": str(dataset.path), "files_sha256": sha256_files([dataset.path])}, None, first_line


def attribute_source(settings: Settings, dataset: DatasetSpec) -> CachedArtifact:
    """The dataset's attribute table (``example_id`` + one column per attribute), cached by content."""
    raw, origin, image_root, first_line = _raw_table(settings, dataset)
    path = Path(origin["path"]) if "path" in origin else None
    table = attribute_table(raw, dataset, path=path, first_line=first_line)
    fingerprint = sha256_text(f"{dataset.name}|{sha256_table(table)}")
    target = settings.cache_dir / "conds_attributes" / fingerprint[:32]
    meta = {
        "dataset": dataset.name,
        "source": dataset.source,
        "fingerprint": fingerprint,
        "n_examples": table.height,
        "image_root": str(image_root) if image_root else None,
        "origin": origin,
    }

    def write(tmp: Path) -> None:
        table.write_parquet(tmp / "attributes.parquet")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), "utf-8")

    publish_cache_dir(target, write)
    return CachedArtifact(target, fingerprint, meta)


def stage_case(
    settings: Settings,
    case: CaseSpec,
    source: CachedArtifact,
    *,
    overrides: Mapping[str, Any] | None = None,
    publish_as: str | None = None,
) -> StagedVersion:
    """Draw the case's splits, measure its shift summary, stage the version with two figures."""
    benchmark = check_benchmark_name(publish_as, "name") if publish_as else case.name
    if source.meta["dataset"] != case.dataset:
        raise InputError(f"case {case.name} is of dataset {case.dataset}, not {source.meta['dataset']}")
    table = pl.read_parquet(source.path / "attributes.parquet")
    sources = {"dataset": case.dataset, "source": source.meta["source"], "attributes_sha256": source.fingerprint}
    tables, draw, summary = build.case_tables(case, table, sources, overrides)
    attachments = {
        CELL_FIGURE: conds_cell_counts(draw.cells, f"{benchmark}: examples per cell"),
        SHARES_FIGURE: conds_value_shares(
            summary.value_counts, tables["conds_attributes"], f"{benchmark}: value shares, train vs test"
        ),
    }
    row = tables["benchmarks"].row(0, named=True)
    manifest = {
        "spec": case.dataset,
        "params": json.loads(row["params"]),
        "sources": json.loads(row["sources"]),
        "n_examples": row["n_examples"],
        "origin": {**source.meta["origin"], "image_root": source.meta["image_root"]},
        "example_path": EXAMPLE_PATHS.get(case.dataset),
        "code_version": CODE_VERSION,
        "environment": environment(),
    }
    return Store(settings.store_dir).stage(
        build.FAMILY, benchmark, tables, manifest_extra=manifest, attachments=attachments
    )
