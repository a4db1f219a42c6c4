"""The MetaShift family: annotations -> scene tables -> subset collections and shift tasks.

The family's declarations only; each job has its own module: which annotations build a spec and what its name
says (:mod:`~shiftbench.metashift.annotations`), the cached scene inputs (:mod:`~shiftbench.metashift.scenes`),
building and staging (:mod:`~shiftbench.metashift.staging`), the same build fanned out into units
(:mod:`~shiftbench.metashift.fanout`), and what a version says about itself (:mod:`~shiftbench.metashift.cards`).

Meta-graphs are built per *collection*, not per class: one sparse product computes every class's
overlaps at once (seconds for all of Visual Genome's 1,700 object classes), while a benchmark per
class would cost a build (and a Dagster partition) for each of hundreds of classes.
"""

from __future__ import annotations

from shiftbench.config.package_files import CONTRACTS_DIR, SQL_DIR
from shiftbench.config.settings import Settings
from shiftbench.families.analysis import Analysis
from shiftbench.families.family import Family, Fanout, Kind, RawSource
from shiftbench.metashift import build
from shiftbench.metashift.annotations import (
    SHIPPED_NAMES,
    TAG_MEANINGS,
    annotations_fingerprint,
    collection_specs,
    recorded_tag,
    task_specs,
    task_unavailable,
)
from shiftbench.metashift.cards import describe_collection, describe_task
from shiftbench.metashift.fanout import build_collection_unit, plan_collection, stage_collection_units
from shiftbench.metashift.figures import accuracy_vs_distance, multiclass_table, subpopulation_table, training_conflicts
from shiftbench.metashift.scenes import RELEASED, SCENES, scenes_needed
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import CollectionSpec, TaskSpec, load_specs
from shiftbench.metashift.staging import CODE_VERSION, stage_collection, stage_task

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
    compute_kinds=frozenset({"scipy", "networkx", "parquet"}),
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


# The paper's analyses over this family's results (shiftbench.families.analysis).
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
    Analysis(
        "metashift-training-conflicts",
        "metashift",
        "analysis_metashift_conflicts",
        "metashift_training_conflicts.sql",
        "MetaShift: conflict zones between subsets during training",
        "Liang and Zou, MetaShift (ICLR 2022), Section 4.3, Figure 4 and Appendix B.3",
        training_conflicts,
        "training_conflicts.png",
        SQL_DIR / "metashift",
    ),
    Analysis(
        "metashift-subpopulation-table",
        "metashift",
        "analysis_metashift_subpopulation",
        "metashift_subpopulation_table.sql",
        "MetaShift: average and worst-group accuracy under subpopulation shift, beside the paper's Table 2",
        "Liang and Zou, MetaShift (ICLR 2022), Section 4.2 and Table 2",
        subpopulation_table,
        "subpopulation_table.png",
        SQL_DIR / "metashift",
    ),
    Analysis(
        "metashift-multiclass-table",
        "metashift",
        "analysis_metashift_multiclass",
        "metashift_multiclass_table.sql",
        "MetaShift: out-of-domain accuracy on ten animal classes as the dog's training data moves away, beside the "
        "paper's Table 3",
        "Liang and Zou, MetaShift (ICLR 2022), Appendix B.2.1 and Table 3",
        multiclass_table,
        "multiclass_table.png",
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
    measures=build.MEASURES,
)
