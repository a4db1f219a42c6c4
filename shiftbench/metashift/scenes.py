"""MetaShift's scene inputs: the configured annotations, or the released attributes, parsed once into
content-addressed cache directories of integer-coded objects and images; builds read them from there."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.family import Input
from shiftbench.metashift.annotations import SOURCE_RELEASED, scene_source
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import CollectionSpec, TaskSpec
from shiftbench.runtime.cache import CachedArtifact, cached
from shiftbench.sources import generated_scenes, gqa_release, packaged
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.sources.scene_graphs import GQA_KIND, SceneTables, read_gqa_scene_graphs, read_tags_table


def released_attributes(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    """MetaShift's released attribute annotations, shipped with the package (CC BY 4.0)."""
    tables = packaged.metashift_scene_tables()
    return _cache_scene_tables(
        settings, tables, "visual-genome", {"paths": [str(packaged.METASHIFT_ATTRIBUTES)], "note": "packaged"}
    )


def scenes_needed(settings: Settings, spec: CollectionSpec | TaskSpec) -> tuple[str, ...]:
    return (RELEASED.name,) if scene_source(settings, spec) == SOURCE_RELEASED else (SCENES.name,)


def scenes_for(
    settings: Settings, spec: CollectionSpec | TaskSpec, inputs: Mapping[str, CachedArtifact]
) -> CachedArtifact:
    (name,) = scenes_needed(settings, spec)
    return inputs[name]


def load_scene_source(settings: Settings) -> tuple[SceneTables, str, dict[str, Any]]:
    """The configured annotations: GQA files, else a tag table, else the generated sample."""
    own = settings.of(MetaShiftSettings)
    if own.gqa_scene_graphs and own.tags_table is not None:
        raise InputError(
            "set either SHIFTBENCH_GQA_SCENE_GRAPHS or SHIFTBENCH_TAGS_TABLE, not both",
            parameter="SHIFTBENCH_TAGS_TABLE",
        )
    if own.gqa_scene_graphs:
        tables = read_gqa_scene_graphs(list(own.gqa_scene_graphs))
        return tables, "visual-genome", {"paths": [str(p) for p in own.gqa_scene_graphs]}
    if own.tags_table is not None:
        return (
            read_tags_table(own.tags_table),
            "tag-table",
            {"paths": [str(own.tags_table)]},
        )
    objects, images, fingerprint = generated_scenes.generate_scene_tables()
    tables = SceneTables.from_frames(objects, images, fingerprint, kind=generated_scenes.GENERATOR_VERSION)
    return tables, generated_scenes.DATASET, {"paths": [], "note": "generated sample, not Visual Genome"}


def scene_tables(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    tables, dataset, origin = load_scene_source(settings)
    return _cache_scene_tables(settings, tables, dataset, origin)


def _cache_scene_tables(
    settings: Settings, tables: SceneTables, dataset: str, origin: dict[str, Any]
) -> CachedArtifact:
    target = settings.cache_dir / "metashift_scene_codes" / tables.fingerprint[:32]
    meta = {
        "kind": tables.kind,
        "dataset": dataset,
        "fingerprint": tables.fingerprint,
        "files_sha256": tables.files_sha256,
        "n_images": tables.images.height,
        "n_objects": tables.coded.height,
        "n_object_names": tables.coded.frame["name"].n_unique(),
        **origin,
    }

    def write(tmp: Path) -> None:
        tables.coded.write(tmp)
        tables.images.write_parquet(tmp / "images.parquet")

    return cached(target, tables.fingerprint, meta, write)


def read_scenes(artifact: CachedArtifact) -> tuple[CodedObjects, pl.DataFrame]:
    """A cached scene source: its coded objects and its images."""
    return CodedObjects.read(artifact.path), pl.read_parquet(artifact.path / "images.parquet")


def recorded_sources(settings: Settings, scenes: CachedArtifact) -> dict[str, Any]:
    """What a version records of its annotations; for GQA files, also whether they are the release's."""
    own = settings.of(MetaShiftSettings)
    sources = {"scenes": scenes.meta["kind"], "dataset": scenes.meta["dataset"], "scenes_sha256": scenes.fingerprint}
    if scenes.meta["kind"] == GQA_KIND:
        sources["gqa_release"] = gqa_release.is_release(list(own.gqa_scene_graphs), settings.cache_dir)
    return sources


SCENES = Input(
    key=("metashift", "scene_tables"),
    description="Scene graphs parsed into objects (image, object, name, attributes) and images "
    "(location, weather, general tags), cached as Parquet.",
    build=scene_tables,
    summary=lambda a: (
        f"annotations: {a.meta['dataset']}, {a.meta['n_images']:,} images, {a.meta['n_objects']:,} objects"
    ),
    rows="n_objects",
    sources=("metashift_annotations",),
    compute_kinds=frozenset({"duckdb", "parquet"}),
    warnings=lambda a: (
        [
            "no SHIFTBENCH_GQA_SCENE_GRAPHS or SHIFTBENCH_TAGS_TABLE: object and general contexts come from the "
            "GENERATED scene sample (benchmarks named NAME@generated)"
        ]
        if a.meta["dataset"] == generated_scenes.DATASET
        else []
    ),
)
RELEASED = Input(
    key=("metashift", "released_attributes"),
    description="MetaShift's released attribute annotations (59,663 Visual Genome images), shipped with the "
    "package (CC BY 4.0): the metashift-attributes collection without any download.",
    build=released_attributes,
    summary=lambda a: f"released attributes: {a.meta['n_images']:,} images, {a.meta['n_objects']:,} objects",
    rows="n_objects",
    sources=("metashift_annotations",),
)
