"""The MetaShift build as steps over settings: each Dagster asset calls one of these.

The scene tables (GQA scene graphs, a tag table, or the generated sample) are parsed once into a
content-addressed cache directory; collections and tasks read them from there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.cache import CachedArtifact, publish_cache_dir
from shiftbench.errors import InputError
from shiftbench.fingerprint import canonical_json, sha256_table
from shiftbench.metashift import build
from shiftbench.metashift.specs import CollectionSpec, MetashiftSpecs, TaskSpec
from shiftbench.plots import metagraph_figure
from shiftbench.publishing import environment
from shiftbench.settings import Settings
from shiftbench.sources import generated_scenes
from shiftbench.sources.scene_graphs import SceneTables, read_class_groups, read_gqa_scene_graphs, read_tags_table
from shiftbench.store import StagedVersion, Store, check_benchmark_name

# Bump when a change to the MetaShift builders can change their output.
CODE_VERSION = "metashift-1"
# Datasets, and how an image id becomes a path under the dataset's image root.
EXAMPLE_ID_FORMATS = {"visual-genome": "{}.jpg", "tag-table": "{}", generated_scenes.DATASET: "{}.jpg"}


def load_scene_source(settings: Settings) -> tuple[SceneTables, str, dict[str, Any]]:
    """The configured annotations: GQA files, else a tag table, else the generated sample."""
    if settings.gqa_scene_graphs and settings.tags_table is not None:
        raise InputError(
            "set either SHIFTBENCH_GQA_SCENE_GRAPHS or SHIFTBENCH_TAGS_TABLE, not both",
            parameter="SHIFTBENCH_TAGS_TABLE",
        )
    if settings.gqa_scene_graphs:
        tables = read_gqa_scene_graphs(list(settings.gqa_scene_graphs))
        return tables, "visual-genome", {"paths": [str(p) for p in settings.gqa_scene_graphs]}
    if settings.tags_table is not None:
        return read_tags_table(settings.tags_table), "tag-table", {"paths": [str(settings.tags_table)]}
    objects, images, fingerprint = generated_scenes.generate_scene_tables()
    tables = SceneTables.from_frames(objects, images, fingerprint, kind=generated_scenes.GENERATOR_VERSION)
    return tables, generated_scenes.DATASET, {"paths": [], "note": "generated sample, not Visual Genome"}


def scene_tables(settings: Settings) -> CachedArtifact:
    tables, dataset, origin = load_scene_source(settings)
    target = settings.cache_dir / "metashift_scenes" / tables.fingerprint[:32]
    meta = {
        "kind": tables.kind,
        "dataset": dataset,
        "fingerprint": tables.fingerprint,
        "files_sha256": tables.files_sha256,
        "n_images": tables.images.height,
        "n_objects": tables.objects.height,
        "n_object_names": tables.objects["name"].n_unique(),
        **origin,
    }

    def write(tmp: Path) -> None:
        tables.objects.write_parquet(tmp / "objects.parquet")
        tables.images.write_parquet(tmp / "images.parquet")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), "utf-8")

    publish_cache_dir(target, write)
    return CachedArtifact(target, tables.fingerprint, meta)


def _read(artifact: CachedArtifact) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(artifact.path / "objects.parquet"), pl.read_parquet(artifact.path / "images.parquet")


def _groups(settings: Settings, wanted: bool) -> tuple[pl.DataFrame | None, dict[str, Any]]:
    if not wanted:
        return None, {}
    if settings.metashift_class_groups is None:
        raise InputError("group_classes=true needs SHIFTBENCH_METASHIFT_CLASS_GROUPS", parameter="group_classes")
    groups = read_class_groups(settings.metashift_class_groups)
    return groups, {"class_groups_sha256": sha256_table(groups)}


def _sources(scenes: CachedArtifact) -> dict[str, Any]:
    return {"scenes": scenes.meta["kind"], "dataset": scenes.meta["dataset"], "scenes_sha256": scenes.fingerprint}


def _manifest_extra(tables: Mapping[str, pl.DataFrame], spec_name: str, scenes: CachedArtifact) -> dict[str, Any]:
    row = tables["benchmarks"].row(0, named=True)
    return {
        "spec": spec_name,
        "params": json.loads(row["params"]),
        "sources": json.loads(row["sources"]),
        "n_examples": row["n_examples"],
        "origin": {"scenes": scenes.meta.get("paths")},
        "code_version": CODE_VERSION,
        "environment": environment(),
    }


def figure_name(class_name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in class_name)
    return f"metagraph_{safe}.png"


def stage_collection(
    settings: Settings,
    specs: MetashiftSpecs,
    spec: CollectionSpec,
    scenes: CachedArtifact,
    *,
    overrides: Mapping[str, Any] | None = None,
    publish_as: str | None = None,
    max_figures: int = 40,
) -> StagedVersion:
    """Build a collection (subsets, meta-graphs, communities, embeddings, distances) and stage it.

    Figures of the ``max_figures`` largest classes' meta-graphs go next to the version (files/).
    """
    benchmark = check_benchmark_name(publish_as, "name") if publish_as else spec.name
    objects, images = _read(scenes)
    groups, group_sources = _groups(settings, spec.group_classes)
    tables, results = build.collection_tables(
        spec, objects, images, specs.general_contexts, {**_sources(scenes), **group_sources}, groups
    )
    params = json.loads(tables["benchmarks"]["params"][0])
    params["overrides"] = dict(overrides or {})
    tables["benchmarks"] = tables["benchmarks"].with_columns(pl.lit(canonical_json(params)).alias("params"))
    largest = sorted(results, key=lambda c: (-len(results[c].graph.nodes), c))[:max_figures]
    attachments = {}
    for class_name in largest:
        result = results[class_name]
        community_of = {m: k for k, members in enumerate(result.communities) for m in members}
        coo = result.graph.weights.tocoo()
        edges = [(int(i), int(j), float(w)) for i, j, w in zip(coo.row, coo.col, coo.data, strict=True) if i < j]
        attachments[figure_name(class_name)] = metagraph_figure(
            result.graph.nodes,
            result.graph.sizes.tolist(),
            edges,
            [community_of[n] for n in result.graph.nodes],
            f"{class_name}: {len(result.graph.nodes)} subsets, {len(result.communities)} communities ({benchmark})",
        )
    warnings = build.distance_warnings(tables["metashift_distances"], spec.embedding)
    return Store(settings.store_dir).stage(
        build.FAMILY,
        benchmark,
        tables,
        manifest_extra={**_manifest_extra(tables, spec.name, scenes), "warnings": warnings},
        attachments=attachments,
    )


def stage_task(
    settings: Settings,
    specs: MetashiftSpecs,
    spec: TaskSpec,
    scenes: CachedArtifact,
    *,
    overrides: Mapping[str, Any] | None = None,
    publish_as: str | None = None,
) -> StagedVersion:
    """Build one shift task's examples and distances and stage them."""
    benchmark = check_benchmark_name(publish_as, "name") if publish_as else spec.name
    objects, images = _read(scenes)
    data = build.task_data(objects, images, spec, specs.general_contexts)
    dataset = str(scenes.meta["dataset"])
    tables = build.task_tables(spec, data, dataset, EXAMPLE_ID_FORMATS[dataset], _sources(scenes), overrides)
    return Store(settings.store_dir).stage(
        build.FAMILY, benchmark, tables, manifest_extra=_manifest_extra(tables, spec.name, scenes)
    )
