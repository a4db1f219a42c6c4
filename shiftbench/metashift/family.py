"""The MetaShift family: annotations -> scene tables -> subset collections and shift tasks.

The scene tables are parsed once into content-addressed cache directories; collections and tasks
read them from there. Which annotations a spec is built from (:func:`scene_source`): the user's GQA
scene graphs when set; else, for a spec of attribute contexts only, MetaShift's released attribute
annotations shipped with the package; else the user's tag table, else the generated scene sample.
Shipped specs built from a tag table or the generated sample are named ``NAME@tags`` /
``NAME@generated`` (:mod:`shiftbench.naming`).

Meta-graphs are built per *collection*, not per class: one sparse product computes every class's
overlaps at once (seconds for all of Visual Genome's 1,700 object classes), while a benchmark per
class would cost a build (and a Dagster partition) for each of hundreds of classes.
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.analysis import Analysis
from shiftbench.cache import CachedArtifact, cached
from shiftbench.cards import CardInfo
from shiftbench.errors import InputError
from shiftbench.family import (
    Description,
    Family,
    Fanout,
    Figure,
    FilePath,
    Input,
    Kind,
    Markdown,
    RawSource,
    Table,
    Target,
)
from shiftbench.fingerprint import canonical_json, sha256_files, sha256_table, sha256_text
from shiftbench.images import STANDIN, image_block
from shiftbench.memory import release_freed_memory
from shiftbench.metashift import build, collection
from shiftbench.metashift.classes import ClassOutcome, ClassResult, ClassSettings
from shiftbench.metashift.figures import (
    MetaGraphDrawing,
    accuracy_vs_distance,
    metagraph_figures_started,
    task_distances,
)
from shiftbench.metashift.index import SceneIndex
from shiftbench.metashift.scope import Scope, scope_line
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import CollectionSpec, TaskSpec, load_specs
from shiftbench.naming import tag_paper_names
from shiftbench.package_files import CONTRACTS_DIR, SQL_DIR
from shiftbench.publishing import stage_tables
from shiftbench.settings import Settings
from shiftbench.sources import generated_scenes, gqa_release, packaged
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.sources.scene_graphs import (
    GQA_KIND,
    SceneTables,
    read_class_groups,
    read_gqa_scene_graphs,
    read_tags_table,
)
from shiftbench.store import StagedVersion
from shiftbench.streamed import StreamedTable, in_memory

# Bump when a change to the MetaShift builders can change their output.
CODE_VERSION = "metashift-4"
# The names of the specs shipped with the package (the papers' names), parsed once.
SHIPPED_NAMES = functools.cache(lambda: frozenset(load_specs(None).collections) | frozenset(load_specs(None).tasks))
# Per dataset: how an image id becomes an example id, and where the example's image is.
EXAMPLE_ID_FORMATS = {"visual-genome": "{}.jpg", "tag-table": "{}", generated_scenes.DATASET: "{}.jpg"}
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
# What a collection stores grows with its inputs (shiftbench.metashift.collection). metashift_distances is a view the
# catalog computes from metashift_embeddings; a version built with store_distances: true also stores it, and its
# contract is checked with the version's others (it has no Dagster check of its own: most versions lack it).
COLLECTION_TABLES = (
    "benchmarks",
    "metashift_subsets",
    "metashift_classes",
    "metashift_edges",
    "metashift_communities",
    "metashift_embeddings",
    "metashift_graphs",
    "metashift_scene_images",
    "metashift_scene_objects",
    "metashift_scene_contexts",
    "metashift_scene_attributes",
    "metashift_scene_class_names",
    "metashift_scene_vocabulary",
    "shift_magnitudes",
)
TASK_TABLES = ("benchmarks", "examples", "metashift_tasks", "metashift_task_communities", "shift_magnitudes")
FIGURES_INLINE = 4
TASK_FIGURE = "task_distances.png"


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


def released_attributes(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    """MetaShift's released attribute annotations, shipped with the package (CC BY 4.0)."""
    tables = packaged.metashift_scene_tables()
    return _cache_scene_tables(
        settings, tables, "visual-genome", {"paths": [str(packaged.METASHIFT_ATTRIBUTES)], "note": "packaged"}
    )


def scenes_needed(settings: Settings, spec: CollectionSpec | TaskSpec) -> tuple[str, ...]:
    return (RELEASED.name,) if scene_source(settings, spec) == SOURCE_RELEASED else (SCENES.name,)


def _scenes_for(
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


def _groups(settings: Settings, wanted: bool) -> tuple[pl.DataFrame | None, dict[str, Any]]:
    own = settings.of(MetaShiftSettings)
    if not wanted:
        return None, {}
    if own.metashift_class_groups is None:
        raise InputError("group_classes=true needs SHIFTBENCH_METASHIFT_CLASS_GROUPS", parameter="group_classes")
    groups = read_class_groups(own.metashift_class_groups)
    return groups, {"class_groups_sha256": sha256_table(groups)}


def _sources(settings: Settings, scenes: CachedArtifact) -> dict[str, Any]:
    """What a version records of its annotations; for GQA files, also whether they are the release's."""
    own = settings.of(MetaShiftSettings)
    sources = {"scenes": scenes.meta["kind"], "dataset": scenes.meta["dataset"], "scenes_sha256": scenes.fingerprint}
    if scenes.meta["kind"] == GQA_KIND:
        sources["gqa_release"] = gqa_release.is_release(list(own.gqa_scene_graphs), settings.cache_dir)
    return sources


def recorded_tag(manifest: Mapping[str, Any]) -> str | None:
    """The tag a published version's recorded sources call for (None: the papers' data)."""
    sources = manifest.get("sources") or {}
    if sources.get("scenes") == GQA_KIND and not sources.get("gqa_release"):
        return gqa_release.TAG
    return DATASET_TAGS.get(str(sources.get("dataset")))


def figure_name(class_name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in class_name)
    return f"metagraph_{safe}.png"


def images_of(settings: Settings, dataset: str) -> dict[str, Any]:
    """The manifest's image block: GQA images, stand-ins for the generated sample, a user's root for tags."""
    own = settings.of(MetaShiftSettings)
    if dataset == "visual-genome":
        return image_block("gqa", "{}", own.gqa_images_dir, "gqa_images_dir")
    if dataset == generated_scenes.DATASET:
        return image_block(STANDIN, "{}", None)
    return image_block("user", "{}", None)


@dataclass(frozen=True)
class CollectionPlan:
    """What every unit of a collection build reads besides the index (pickled into the work folder)."""

    spec: CollectionSpec
    scope: Scope
    settings: ClassSettings
    sources: dict[str, Any]
    dataset: str
    origin: dict[str, Any]


def _prepare_collection(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]
) -> tuple[CollectionPlan, SceneIndex]:
    own = settings.of(MetaShiftSettings)
    spec = target.spec
    assert isinstance(spec, CollectionSpec)
    scenes = _scenes_for(settings, spec, inputs)
    objects, images = read_scenes(scenes)
    groups, group_sources = _groups(settings, spec.group_classes)
    index, scope = collection.prepare(spec, objects, images, load_specs(own.metashift_specs).general_contexts, groups)
    plan = CollectionPlan(
        spec,
        scope,
        collection.class_settings(spec),
        {**_sources(settings, scenes), **group_sources},
        str(scenes.meta["dataset"]),
        {"scenes": scenes.meta.get("paths")},
    )
    return plan, index


def stage_collection(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Build a collection (subsets, meta-graphs, communities, embeddings) and stage it: its classes on this
    process's threads, or in ``SHIFTBENCH_METASHIFT_BUCKETS`` buckets of worker processes (the same version)."""
    own = settings.of(MetaShiftSettings)
    plan, index = _prepare_collection(settings, target, inputs)
    if own.metashift_buckets <= 0:
        outcomes = collection.build_classes(index, plan.settings)
    else:
        work_dir = settings.cache_dir / "metashift_work"
        work_dir.mkdir(parents=True, exist_ok=True)
        outcomes = collection.build_in_processes(index, plan.settings, own.metashift_buckets, work_dir)
    figures = _figures_started(outcomes, target.benchmark)
    tables, results, distances = collection.collection_tables(plan.spec, index, plan.scope, outcomes, plan.sources)
    del index, outcomes, results  # not held while the version is hashed, written and checked
    release_freed_memory()
    return _stage_built(settings, target, plan, tables, distances, figures)


# -- the same build fanned out: a plan, units that run apart (processes, Dagster steps), one stage -----------------
def plan_collection(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact], work: Path, n_units: int
) -> list[str]:
    """Write the index and the plan into ``work`` and split the classes into ``n_units`` buckets (their names)."""
    plan, index = _prepare_collection(settings, target, inputs)
    if not 1 <= n_units <= len(index.classes):  # a unit builds whole classes: never fewer steps than asked, silently
        raise InputError(
            f"{n_units} units for the {len(index.classes)} classes of {target.benchmark}: a unit builds whole classes, "
            f"so 1..{len(index.classes)}",
            parameter="units",
        )
    groups = collection.buckets(index, n_units)
    work.mkdir(parents=True, exist_ok=True)
    index.save(work / "index")
    (work / "plan.pickle").write_bytes(pickle.dumps(plan))
    units = {str(k): group for k, group in enumerate(groups)}
    (work / "units.json").write_text(json.dumps(units), "utf-8")
    return list(units)


def build_collection_unit(work: Path, unit: str) -> None:
    """One bucket of classes, from the saved index (memory-mapped), into ``work/unit-<name>.pickle``."""
    plan: CollectionPlan = pickle.loads((work / "plan.pickle").read_bytes())
    codes = json.loads((work / "units.json").read_text("utf-8"))[unit]
    collection.build_bucket(work / "index", plan.settings, codes, work / f"unit-{unit}.pickle", workers=1)


def stage_collection_units(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact], work: Path
) -> StagedVersion:
    """The version from every unit's classes: the tables, hence the id, of a build in one piece."""
    plan: CollectionPlan = pickle.loads((work / "plan.pickle").read_bytes())
    units = json.loads((work / "units.json").read_text("utf-8"))
    outcomes = collection.read_buckets([work / f"unit-{unit}.pickle" for unit in units])
    figures = _figures_started(outcomes, target.benchmark)
    index = SceneIndex.load(work / "index")
    tables, results, distances = collection.collection_tables(plan.spec, index, plan.scope, outcomes, plan.sources)
    del index, outcomes, results
    release_freed_memory()
    return _stage_built(settings, target, plan, tables, distances, figures)


def _stage_built(
    settings: Settings,
    target: Target,
    plan: CollectionPlan,
    tables: dict[str, pl.DataFrame | StreamedTable],
    distances: collection.DistanceCounts,
    figures: Callable[[], dict[str, bytes]],
) -> StagedVersion:
    """Stage the collection's tables; the figures of the largest classes' meta-graphs (:func:`_figures_started`)
    go next to it (files/)."""
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


def _figures_started(outcomes: Sequence[ClassOutcome], benchmark: str) -> Callable[[], dict[str, bytes]]:
    """Figures of the largest classes' meta-graphs, being drawn from now on (the call waits for them)."""
    results = {o.class_name: o.result for o in outcomes if o.result is not None}
    largest = sorted(results, key=lambda c: (-len(results[c].graph.nodes), c))[:MAX_FIGURES]
    in_worker = sum(len(result.graph.nodes) for result in results.values()) >= FIGURES_IN_WORKER_FROM
    pngs = metagraph_figures_started([_drawing(results[n], n, benchmark) for n in largest], in_worker=in_worker)
    return lambda: {figure_name(name): png for name, png in zip(largest, pngs(), strict=True)}


def _drawing(result: ClassResult, class_name: str, benchmark: str) -> MetaGraphDrawing:
    """A class's meta-graph as its figure shows it."""
    community_of = {m: k for k, members in enumerate(result.communities) for m in members}
    nodes = result.graph.nodes
    # A figure of thousands of labelled nodes is unreadable and takes tens of seconds: draw the
    # largest subsets (nodes come largest first) and their edges, and say so in the title.
    shown = min(len(nodes), MAX_FIGURE_NODES)
    coo = result.graph.weights.tocoo()
    edges = [(int(i), int(j), float(w)) for i, j, w in zip(coo.row, coo.col, coo.data, strict=True) if i < j < shown]
    drawn = f"the {shown} largest of " if shown < len(nodes) else ""
    return MetaGraphDrawing(
        nodes[:shown],
        result.graph.sizes[:shown].tolist(),
        edges,
        [community_of[n] for n in nodes[:shown]],
        f"{class_name}: {drawn}{len(nodes)} subsets, {len(result.communities)} communities ({benchmark})",
    )


def stage_task(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Build one shift task's examples and distances and stage them."""
    own = settings.of(MetaShiftSettings)
    spec = target.spec
    assert isinstance(spec, TaskSpec)
    scenes = _scenes_for(settings, spec, inputs)
    specs = load_specs(own.metashift_specs)
    objects, images = read_scenes(scenes)
    data = build.task_data(objects, images, spec, specs.general_contexts)
    dataset = str(scenes.meta["dataset"])
    tables = build.task_tables(
        spec, data, dataset, EXAMPLE_ID_FORMATS[dataset], _sources(settings, scenes), target.overrides
    )

    def figures() -> dict[str, bytes]:
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
    )


CITATION = (
    "W. Liang, J. Zou. MetaShift: A Dataset of Datasets for Evaluating Contextual Distribution Shifts and "
    "Training Conflicts. ICLR 2022."
)
COLLECTION_SHIFT = (
    "A collection, not a split: subsets of images of one class sharing a context (class(context)), their "
    "meta-graphs and spectral distances, from which shift tasks are cut; the larger the distance between two "
    "subsets, the larger the shift between them."
)
TASK_SHIFT = {
    "domain_generalization": "Domain generalization over contexts: the training communities of each class and "
    "its test community are different contexts (class(context)); d is the spectral distance between them.",
    "subpopulation": "Subpopulation shift: a spurious context (e.g. indoor/outdoor) is correlated with the class "
    "in training, with the minority groups a given fraction; the test set is balanced over groups.",
}
DATASET_LICENCES = {
    "visual-genome": (
        "Annotations: MetaShift (CC BY 4.0) over Visual Genome scene graphs (CC BY 4.0)",
        "Images: Visual Genome (CC BY 4.0); not redistributed",
    ),
    generated_scenes.DATASET: ("Annotations: generated by shiftbench's scene sampler (MIT); NOT Visual Genome",),
    "tag-table": ("Annotations: the user's tag table (its own licence)",),
}


def card_info(dataset: str, shift: str, kind: str) -> CardInfo:
    return CardInfo(
        title=f"MetaShift {kind}",
        shift=shift,
        licences=DATASET_LICENCES.get(dataset, (f"Annotations: {dataset}",)),
        citation=CITATION,
    )


def describe_collection(staged: StagedVersion) -> Description:
    manifest = staged.manifest()
    subsets = pl.read_parquet(staged.table_path("metashift_subsets"), columns=["selected"])
    classes = pl.read_parquet(staged.table_path("metashift_classes"), columns=["n_candidates"])
    n_images = pl.scan_parquet(staged.table_path("metashift_scene_images")).select(pl.len()).collect().item()
    graphs = pl.read_parquet(staged.table_path("metashift_graphs")).sort("n_subsets", "class", descending=[True, False])
    query = (
        "SELECT class, n_subsets, n_components, n_communities, modularity FROM metashift_graphs "
        f"WHERE benchmark = '{staged.benchmark}' ORDER BY n_subsets DESC"
    )
    metadata: dict[str, Any] = {
        "dataset": str(manifest["sources"].get("dataset")),
        "candidate_subsets": int(classes["n_candidates"].sum()),
        "selected_subsets": int(subsets["selected"].sum()),
        "classes": graphs.height,
        "images": n_images,
        "graphs": Table(
            graphs.select("class", "n_subsets", "n_edges", "n_components", "n_communities", "status").head(15)
        ),
        "warnings": Markdown("\n".join(f"- **{w}**" for w in manifest.get("warnings", [])) or "none"),
        "figures": FilePath(staged.path / "files"),
        "duckdb_query": Markdown(query),
    }
    attachments = manifest.get("attachments", {})
    shown = [c for c in ("cat", "dog") if figure_name(c) in attachments]
    shown += [c for c in graphs["class"].to_list() if c not in shown and figure_name(c) in attachments]
    for class_name in shown[:FIGURES_INLINE]:
        png = (staged.path / attachments[figure_name(class_name)]["file"]).read_bytes()
        metadata[f"metagraph/{class_name}"] = Figure(png, f"{class_name} meta-graph")
    summary = (
        f"{int(subsets['selected'].sum()):,} of {int(classes['n_candidates'].sum()):,} subsets selected in "
        f"{graphs.height:,} classes, {n_images:,} images"
    )
    return Description(metadata, summary, tuple(manifest.get("warnings", [])))


def describe_task(staged: StagedVersion) -> Description:
    manifest = staged.manifest()
    summary = pl.read_parquet(staged.table_path("metashift_tasks")).row(0, named=True)
    communities = pl.read_parquet(staged.table_path("metashift_task_communities"))
    query = f"SELECT split, \"group\", count(*) FROM examples WHERE benchmark = '{staged.benchmark}' GROUP BY ALL"
    distance = summary["distance"]
    plot = staged.attachment(TASK_FIGURE)
    metadata: dict[str, Any] = {
        "dataset": str(manifest["sources"].get("dataset")),
        "distance": float(distance) if distance is not None else "NULL",
        "distance_status": summary["distance_status"],
        "scaled_down": summary["scaled_down"],
        "communities": Table(
            communities.select("community", "role", "split", "n_available", "n_selected", "distance_status")
        ),
        **({"distances_plot": Figure(plot, "distances to the reference community")} if plot else {}),
        "duckdb_query": Markdown(query),
    }
    line = (
        f"{manifest['n_examples']:,} examples, d={distance:.3f}"
        if distance is not None
        else (f"{manifest['n_examples']:,} examples, d=NULL ({summary['distance_status']})")
    )
    return Description(metadata, line, tuple(manifest.get("warnings", [])))


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
    kinds=frozenset({"duckdb", "parquet"}),
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
MAX_FIGURES = 12  # the largest classes; the UI shows 4 inline (FIGURES_INLINE)
MAX_FIGURE_NODES = 60  # about what MetaShift's Figure 2 shows per class
FIGURES_IN_WORKER_FROM = 5_000  # selected subsets from which a worker draws the figures (GQA attributes: 8,015)


COLLECTION = Kind(
    family=build.FAMILY,
    name="collection",
    plural="collections",
    description="A subset collection: candidate subsets, per-class meta-graphs (sparse overlap), communities, "
    "spectral embeddings and distances.",
    tables=COLLECTION_TABLES,
    inputs=(SCENES.name, RELEASED.name),
    spec_model=CollectionSpec,
    specs=collection_specs,
    needs=lambda settings, spec: scenes_needed(settings, spec),  # type: ignore[arg-type]
    stage=stage_collection,
    fanout=Fanout(plan_collection, build_collection_unit, stage_collection_units),
    describe=describe_collection,
    trainable=False,
    code_version=CODE_VERSION,
    kinds=frozenset({"scipy", "networkx", "parquet"}),
    spec_source="metashift_specs",
    spec_context=lambda settings, spec: load_specs(settings.of(MetaShiftSettings).metashift_specs).general_contexts,
    example="metashift-attributes",
)
TASK = Kind(
    family=build.FAMILY,
    name="task",
    plural="tasks",
    description="One MetaShift shift task (leakage-free pools, sampled WILDS splits, distance d).",
    tables=TASK_TABLES,
    inputs=(SCENES.name, RELEASED.name),
    spec_model=TaskSpec,
    specs=task_specs,
    needs=lambda settings, spec: scenes_needed(settings, spec),  # type: ignore[arg-type]
    stage=stage_task,
    unavailable=lambda settings, spec: task_unavailable(settings, spec),  # type: ignore[arg-type]
    describe=describe_task,
    code_version=CODE_VERSION,
    spec_source="metashift_specs",
    spec_context=lambda settings, spec: load_specs(settings.of(MetaShiftSettings).metashift_specs).general_contexts,
    example="cat-dog-dg-cabinet-bed@generated",
)


def _training_unavailable(settings: Settings) -> str | None:
    own = settings.of(MetaShiftSettings)
    if own.gqa_images_dir is None and (own.gqa_scene_graphs or own.tags_table is not None):
        return "MetaShift tasks train on Visual Genome / GQA images: set SHIFTBENCH_GQA_IMAGES_DIR"
    return None  # the generated sample trains on stand-in images


# The paper's analyses over this family's results (shiftbench.analysis).
ANALYSES = (
    Analysis(
        "metashift-accuracy-vs-distance",
        "metashift",
        "analysis_metashift_distance",
        "metashift_accuracy_vs_distance.sql",
        "MetaShift: accuracy against the training-test distance d",
        "Liang and Zou, MetaShift (ICLR 2022), Section 4.2 and Figure 5",
        accuracy_vs_distance,
        "accuracy_vs_distance.png",
        SQL_DIR / "metashift",
    ),
)
METASHIFT = Family(
    name=build.FAMILY,
    title="MetaShift",
    description="MetaShift (Liang & Zou, ICLR 2022): subsets of images by context, meta-graphs and shift tasks.",
    raw_sources=(
        RawSource(
            "metashift_annotations",
            "SHIFTBENCH_GQA_SCENE_GRAPHS files, or SHIFTBENCH_TAGS_TABLE, or the generated scene sample; and the "
            "released attribute annotations shipped with the package.",
            annotations_fingerprint,
        ),
    ),
    inputs=(SCENES, RELEASED),
    kinds=(COLLECTION, TASK),
    training_unavailable=_training_unavailable,
    shipped_names=SHIPPED_NAMES,
    source_tag=recorded_tag,
    tag_meaning=TAG_MEANINGS.get,
    settings=MetaShiftSettings,
    analyses=ANALYSES,
    contracts_dir=CONTRACTS_DIR / "metashift",
)
