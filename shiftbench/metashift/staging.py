"""Building a MetaShift collection or task from its scenes and staging the version.

A collection's classes are built on this process's threads, in buckets of worker processes, or as units that run
apart (:mod:`shiftbench.metashift.fanout`): every way gives the same tables, hence the same version.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.family import Target
from shiftbench.metashift import build, collection
from shiftbench.metashift.cards import COLLECTION_SHIFT, TASK_SHIFT, card_info
from shiftbench.metashift.classes import ClassSettings
from shiftbench.metashift.figures import TASK_FIGURE, collection_figures_started, task_distances
from shiftbench.metashift.index import SceneIndex
from shiftbench.metashift.scenes import read_scenes, recorded_sources, scenes_for
from shiftbench.metashift.scope import Scope, scope_line
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import CollectionSpec, TaskSpec, load_specs
from shiftbench.runtime.cache import CachedArtifact
from shiftbench.runtime.memory import release_freed_memory
from shiftbench.sources import generated_scenes
from shiftbench.sources.scene_graphs import read_class_groups
from shiftbench.splits.images import STANDIN, image_block
from shiftbench.store import StagedVersion
from shiftbench.tables.fingerprint import canonical_json, sha256_table
from shiftbench.tables.streamed import StreamedTable, in_memory
from shiftbench.warehouse.publishing import stage_tables

# Bump when a change to the MetaShift builders can change their output.
CODE_VERSION = "metashift-4"
# Per dataset: how an image id becomes an example id, and where the example's image is.
EXAMPLE_ID_FORMATS = {"visual-genome": "{}.jpg", "tag-table": "{}", generated_scenes.DATASET: "{}.jpg"}


def images_of(settings: Settings, dataset: str) -> dict[str, Any]:
    """The manifest's image block: GQA images, stand-ins for the generated sample, a user's root for tags."""
    own = settings.of(MetaShiftSettings)
    if dataset == "visual-genome":
        return image_block("gqa", "{}", own.gqa_images_dir, "gqa_images_dir")
    if dataset == generated_scenes.DATASET:
        return image_block(STANDIN, "{}", None)
    return image_block("user", "{}", None)


def _groups(settings: Settings, wanted: bool) -> tuple[pl.DataFrame | None, dict[str, Any]]:
    own = settings.of(MetaShiftSettings)
    if not wanted:
        return None, {}
    if own.metashift_class_groups is None:
        raise InputError("group_classes=true needs SHIFTBENCH_METASHIFT_CLASS_GROUPS", parameter="group_classes")
    groups = read_class_groups(own.metashift_class_groups)
    return groups, {"class_groups_sha256": sha256_table(groups)}


@dataclass(frozen=True)
class CollectionPlan:
    """What every unit of a collection build reads besides the index (pickled into the work folder)."""

    spec: CollectionSpec
    scope: Scope
    settings: ClassSettings
    sources: dict[str, Any]
    dataset: str
    origin: dict[str, Any]


def prepare_collection(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]
) -> tuple[CollectionPlan, SceneIndex]:
    own = settings.of(MetaShiftSettings)
    spec = target.spec
    assert isinstance(spec, CollectionSpec)
    scenes = scenes_for(settings, spec, inputs)
    objects, images = read_scenes(scenes)
    groups, group_sources = _groups(settings, spec.group_classes)
    index, scope = collection.prepare(spec, objects, images, load_specs(own.metashift_specs).general_contexts, groups)
    plan = CollectionPlan(
        spec,
        scope,
        ClassSettings.of(spec),
        {**recorded_sources(settings, scenes), **group_sources},
        str(scenes.meta["dataset"]),
        {"scenes": scenes.meta.get("paths")},
    )
    return plan, index


def stage_collection(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Build a collection (subsets, meta-graphs, communities, embeddings) and stage it: its classes on this
    process's threads, or in ``SHIFTBENCH_METASHIFT_BUCKETS`` buckets of worker processes (the same version)."""
    own = settings.of(MetaShiftSettings)
    plan, index = prepare_collection(settings, target, inputs)
    if own.metashift_buckets <= 0:
        outcomes = collection.build_classes(index, plan.settings)
    else:
        work_dir = settings.cache_dir / "metashift_work"
        work_dir.mkdir(parents=True, exist_ok=True)
        outcomes = collection.build_in_processes(index, plan.settings, own.metashift_buckets, work_dir)
    figures = collection_figures_started(outcomes, target.benchmark)
    tables, results, distances = collection.collection_tables(plan.spec, index, plan.scope, outcomes, plan.sources)
    del index, outcomes, results  # not held while the version is hashed, written and checked
    release_freed_memory()
    return stage_built(settings, target, plan, tables, distances, figures)


def stage_built(
    settings: Settings,
    target: Target,
    plan: CollectionPlan,
    tables: dict[str, pl.DataFrame | StreamedTable],
    distances: collection.DistanceCounts,
    figures: Callable[[], dict[str, bytes]],
) -> StagedVersion:
    """Stage the collection's tables; the figures of the largest classes' meta-graphs
    (:func:`shiftbench.metashift.figures.collection_figures_started`) go next to it (files/)."""
    benchmark = target.benchmark
    benchmarks = in_memory(tables["benchmarks"])
    params = json.loads(benchmarks["params"][0])
    params["overrides"] = dict(target.overrides)
    tables["benchmarks"] = benchmarks.with_columns(pl.lit(canonical_json(params)).alias("params"))

    return stage_tables(
        settings,
        build.FAMILY,
        benchmark,
        tables,
        spec=plan.spec.name,
        origin=plan.origin,
        code_version=CODE_VERSION,
        images=None,
        attachments=figures,
        warnings=build.distance_warnings(distances, plan.spec.embedding),
        card=card_info(plan.dataset, f"{COLLECTION_SHIFT} {scope_line(params)}", "collection"),
        consume=True,  # the collection's frames are let go as the store takes them,
        check=target.check,
    )


def stage_task(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Build one shift task's examples and distances and stage them."""
    own = settings.of(MetaShiftSettings)
    spec = target.spec
    assert isinstance(spec, TaskSpec)
    scenes = scenes_for(settings, spec, inputs)
    specs = load_specs(own.metashift_specs)
    objects, images = read_scenes(scenes)
    data = build.task_data(objects, images, spec, specs.general_contexts)
    dataset = str(scenes.meta["dataset"])
    tables, manifest_extra = build.task_version(
        spec, data, dataset, EXAMPLE_ID_FORMATS[dataset], recorded_sources(settings, scenes), target.overrides
    )

    def figures() -> dict[str, bytes]:
        if spec.kind == "conflicts":  # no distances: its subsets are chosen at random, not at a distance
            return {}
        title = f"{target.benchmark}: distances to the reference community"
        return {TASK_FIGURE: task_distances(tables["metashift_task_communities"], title)}

    return stage_tables(
        settings,
        build.FAMILY,
        target.benchmark,
        tables,
        spec=spec.name,
        origin={"scenes": scenes.meta.get("paths")},
        code_version=CODE_VERSION,
        images=images_of(settings, dataset),
        attachments=figures,
        card=card_info(dataset, TASK_SHIFT[spec.kind], "task"),
        check=target.check,
        manifest_extra=manifest_extra,
    )
