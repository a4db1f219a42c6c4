"""Which annotations build a MetaShift spec, and what a shipped spec's name says about them.

:func:`scene_source`: the user's GQA scene graphs when set; else, for a spec of attribute contexts only,
MetaShift's released attribute annotations shipped with the package; else the user's tag table, else the
generated scene sample. Shipped specs built from a tag table or the generated sample are named ``NAME@tags`` /
``NAME@generated`` (:mod:`shiftbench.specs.naming`), and a version's recorded sources give its tag back
(:func:`recorded_tag`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from shiftbench.config.settings import Settings
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import CollectionSpec, TaskSpec, load_specs
from shiftbench.sources import generated_scenes, gqa_release, packaged
from shiftbench.sources.scene_graphs import GQA_KIND
from shiftbench.specs.naming import tag_paper_names
from shiftbench.tables.fingerprint import sha256_files, sha256_text

# The names of the specs shipped with the package (the papers' names), parsed once.
SHIPPED_NAMES = functools.cache(lambda: frozenset(load_specs(None).collections) | frozenset(load_specs(None).tasks))
# Where a spec's annotations come from, and what a shipped spec's name says after '@' then.
SOURCE_GQA, SOURCE_RELEASED, SOURCE_TAGS, SOURCE_GENERATED = "gqa", "released-attributes", "tags", "generated"
NAME_TAGS = {SOURCE_TAGS: "tags", SOURCE_GENERATED: "generated"}
DATASET_TAGS = {generated_scenes.DATASET: "generated", "tag-table": "tags"}  # by the dataset a version records
_RELEASE_COUNTS = " and ".join(f"{n:,}" for n in gqa_release.RELEASE_IMAGE_COUNTS)
_GQA = "SHIFTBENCH_GQA_SCENE_GRAPHS naming GQA's released scene graphs gives the paper's name"
TAG_MEANINGS = {  # why a shipped spec is not under the paper's name, and what gives it back
    "generated": f"object and general contexts of the generated scene sample, not of Visual Genome; {_GQA}",
    "tags": f"contexts from the tag table SHIFTBENCH_TAGS_TABLE, not from Visual Genome; {_GQA}",
    gqa_release.TAG: "SHIFTBENCH_GQA_SCENE_GRAPHS holds files in GQA's format that are not GQA's two released "
    f"scene-graph files (told apart by their image counts, {_RELEASE_COUNTS}); GQA's files give the paper's name",
}


def annotations_fingerprint(settings: Settings) -> str:
    own = settings.of(MetaShiftSettings)
    files = [
        *own.gqa_scene_graphs,
        *([own.tags_table] if own.tags_table else []),
    ]
    existing = [f for f in files if f.is_file()] + [packaged.METASHIFT_ATTRIBUTES]
    return sha256_text(f"{sha256_files(existing)}|{len(files)}|{generated_scenes.GENERATOR_VERSION}")


def scene_source(settings: Settings, spec: CollectionSpec | TaskSpec) -> str:
    """Which annotations build ``spec``: GQA when given, the released attributes for attribute contexts,
    else the tag table or the generated sample."""
    own = settings.of(MetaShiftSettings)
    if own.gqa_scene_graphs:
        return SOURCE_GQA
    if tuple(spec.context_kinds) == ("attribute",):
        return SOURCE_RELEASED
    return SOURCE_TAGS if own.tags_table is not None else SOURCE_GENERATED


def task_unavailable(settings: Settings, spec: TaskSpec) -> str | None:
    """A task of classes the generated sample has no images of cannot be built on it (the paper's other pairs)."""
    if scene_source(settings, spec) != SOURCE_GENERATED:
        return None
    missing = [c for c in spec.classes if c not in generated_scenes.CLASSES]
    if not missing:
        return None
    return (
        f"the generated scene sample has no {'/'.join(missing)} images: set SHIFTBENCH_GQA_SCENE_GRAPHS "
        "(GQA scene graphs)"
    )


def source_tag(settings: Settings, spec: CollectionSpec | TaskSpec) -> str | None:
    """What a shipped spec's name carries after '@' with these annotations: nothing for the papers' data."""
    own = settings.of(MetaShiftSettings)
    source = scene_source(settings, spec)
    if source == SOURCE_GQA:
        return None if gqa_release.is_release(list(own.gqa_scene_graphs), settings.cache_dir) else gqa_release.TAG
    return NAME_TAGS.get(source)


def collection_specs(settings: Settings) -> dict[str, CollectionSpec]:
    own = settings.of(MetaShiftSettings)
    specs = load_specs(own.metashift_specs).collections
    shipped = SHIPPED_NAMES()
    return tag_paper_names(specs, shipped, lambda spec: source_tag(settings, spec))


def task_specs(settings: Settings) -> dict[str, TaskSpec]:
    own = settings.of(MetaShiftSettings)
    specs = load_specs(own.metashift_specs).tasks
    shipped = SHIPPED_NAMES()

    def tag(spec: TaskSpec) -> str | None:  # a task that cannot be built here keeps the paper's name
        return source_tag(settings, spec) if task_unavailable(settings, spec) is None else None

    return tag_paper_names(specs, shipped, tag)


def recorded_tag(manifest: Mapping[str, Any]) -> str | None:
    """The tag a published version's recorded sources call for (None: the papers' data)."""
    sources = manifest.get("sources") or {}
    if sources.get("scenes") == GQA_KIND and not sources.get("gqa_release"):
        return gqa_release.TAG
    return DATASET_TAGS.get(str(sources.get("dataset")))
