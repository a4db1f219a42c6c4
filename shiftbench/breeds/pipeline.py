"""The BREEDS build as steps over settings: each Dagster asset calls one of these.

Intermediate results (the ImageNet hierarchy, the image list, the calibrated hierarchy) are
content-addressed cache directories (:mod:`shiftbench.cache`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.breeds import calibrated as cal
from shiftbench.breeds.build import FAMILY, build_tables
from shiftbench.breeds.specs import BreedsSpec
from shiftbench.cache import CachedArtifact, publish_cache_dir
from shiftbench.fingerprint import sha256_table, sha256_text
from shiftbench.hierarchy import Hierarchy
from shiftbench.publishing import environment
from shiftbench.settings import Settings
from shiftbench.sources.breeds_hierarchy import locate_breeds_hierarchy, read_breeds_hierarchy_dir
from shiftbench.sources.imagenet import load_imagenet_images, read_imagenet_hierarchy_dir
from shiftbench.sources.wordnet import load_wordnet
from shiftbench.store import StagedVersion, Store, check_benchmark_name

# Bump when a change to the BREEDS builder can change its output: Dagster marks every
# benchmark stale and the scheduled rebuild redoes them.
CODE_VERSION = "breeds-1"


def imagenet_hierarchy(settings: Settings) -> CachedArtifact:
    """WordNet's noun hierarchy in ImageNet form, from the user's files or nltk."""
    if settings.imagenet_hierarchy_dir is not None:
        files = read_imagenet_hierarchy_dir(settings.imagenet_hierarchy_dir)
        edges, nodes, file_fingerprint = files.edges, files.nodes, files.fingerprint
        origin = {"kind": "imagenet-hierarchy-files", "path": str(settings.imagenet_hierarchy_dir)}
    else:
        tables = load_wordnet(settings.wordnet_dict_dir, settings.cache_dir, offline=settings.offline)
        edges, nodes, file_fingerprint = tables.edges, tables.nodes, tables.fingerprint
        origin = {"kind": "wordnet-nltk", "path": str(settings.wordnet_dict_dir)}
    # Content, not files: ImageNet's files and nltk's WordNet hold the same hierarchy, so both
    # routes give the same fingerprint and hence the same benchmark versions.
    fingerprint = sha256_text(f"{sha256_table(edges)}|{sha256_table(nodes)}")
    target = settings.cache_dir / "imagenet_hierarchy" / fingerprint[:32]
    meta = {
        **origin,
        "fingerprint": fingerprint,
        "files_sha256": file_fingerprint,
        "n_edges": edges.height,
        "n_nodes": nodes.height,
    }

    def write(tmp: Path) -> None:
        edges.write_parquet(tmp / "edges.parquet")
        nodes.write_parquet(tmp / "nodes.parquet")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), "utf-8")

    publish_cache_dir(target, write)
    return CachedArtifact(target, fingerprint, meta)


def load_hierarchy(artifact: CachedArtifact) -> Hierarchy:
    return Hierarchy.from_tables(
        pl.read_parquet(artifact.path / "edges.parquet"), pl.read_parquet(artifact.path / "nodes.parquet")
    )


def imagenet_images(settings: Settings) -> CachedArtifact:
    """The images of the 1000 classes: packaged validation labels, plus train/ when given."""
    loaded = load_imagenet_images(settings.imagenet_dir)
    target = settings.cache_dir / "imagenet_images" / loaded.fingerprint[:32]
    meta = {
        "kind": "imagenet-dir" if loaded.has_train else "imagenet-val-package",
        "fingerprint": loaded.fingerprint,
        "n_images": loaded.images.height,
        "path": str(settings.imagenet_dir) if settings.imagenet_dir else None,
    }

    def write(tmp: Path) -> None:
        loaded.images.write_parquet(tmp / "images.parquet")
        loaded.classes.write_parquet(tmp / "classes.parquet")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), "utf-8")

    publish_cache_dir(target, write)
    return CachedArtifact(target, loaded.fingerprint, meta)


def calibrated_hierarchy(settings: Settings, hierarchy: CachedArtifact, images: CachedArtifact) -> CachedArtifact:
    """The published BREEDS hierarchy when available, else WordNet's default calibration."""
    located, reason = locate_breeds_hierarchy(
        settings.breeds_hierarchy_dir,
        settings.breeds_url,
        settings.cache_dir,
        offline=settings.offline,
        timeout_s=settings.download_timeout_s,
    )
    if located is not None:
        result = cal.from_published(read_breeds_hierarchy_dir(located, reason), settings.breeds_calibration)
    else:
        classes = pl.read_parquet(images.path / "classes.parquet")["wnid"].to_list()
        result = cal.from_wordnet(
            load_hierarchy(hierarchy), hierarchy.fingerprint, classes, settings.breeds_calibration, reason
        )
    fingerprint = result.fingerprint
    target = settings.cache_dir / "calibrated_hierarchy" / fingerprint[:32]
    publish_cache_dir(target, result.save)
    meta = {
        "kind": result.kind,
        "fingerprint": fingerprint,
        "n_nodes": len(result.hierarchy.nodes),
        "n_classes": len(result.classes_in_hierarchy),
        "is_tree": result.hierarchy.is_tree(),
        **result.origin,
    }
    return CachedArtifact(target, fingerprint, meta)


def stage_benchmark(
    settings: Settings,
    spec: BreedsSpec,
    hierarchy: CachedArtifact,
    images: CachedArtifact,
    *,
    overrides: dict[str, Any] | None = None,
    publish_as: str | None = None,
) -> StagedVersion:
    """Build one benchmark's tables and stage them as an (unpublished) version."""
    benchmark = check_benchmark_name(publish_as, "name") if publish_as else spec.name
    calibrated = cal.CalibratedHierarchy.load(hierarchy.path)
    image_table = pl.read_parquet(images.path / "images.parquet")
    image_sources = {"images": images.meta["kind"], "images_sha256": images.fingerprint}
    tables = build_tables(spec, calibrated, image_table, image_sources, overrides=overrides)
    benchmark_row = tables["benchmarks"].row(0, named=True)
    manifest_extra = {
        "spec": spec.name,
        "params": json.loads(benchmark_row["params"]),
        "sources": json.loads(benchmark_row["sources"]),
        "n_examples": benchmark_row["n_examples"],
        "origin": {"hierarchy": calibrated.origin, "images": images.meta.get("path")},
        "code_version": CODE_VERSION,
        "environment": environment(),
    }
    return Store(settings.store_dir).stage(FAMILY, benchmark, tables, manifest_extra=manifest_extra)
