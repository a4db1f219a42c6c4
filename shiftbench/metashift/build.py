"""MetaShift family: the published tables of a task, and what collections and tasks share.

Dataset card
------------
- Source: MetaShift (Liang & Zou, ICLR 2022), CC BY 4.0; annotations are Visual Genome / GQA
  scene graphs (CC BY 4.0), a user's tag table, or the generated sample (not real data).
- A *collection* (``metashift``, ``metashift-attributes``) is the set of selected subsets with
  their meta-graphs, communities and spectral embeddings; distances between subsets are a view
  over the embeddings (:mod:`shiftbench.metashift.collection`). It has no examples of its own.
- A *task* is a benchmark with examples. Splits (WILDS names): domain generalization: train
  communities -> ``train``, test communities -> ``test``, the released scripts' additional test
  communities -> ``val`` (OOD validation); subpopulation shift: ``train`` (minority fraction p)
  and a balanced ``test``; ``id_val`` holds ``id_val_fraction`` of each training community.
- ``y`` is the class index in the task's ``classes``; ``group`` the community an image was drawn from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from shiftbench.families.benchmarks_table import benchmarks_row
from shiftbench.metashift import embedding as em
from shiftbench.metashift.conflicts import build_conflicts
from shiftbench.metashift.specs import TaskSpec
from shiftbench.metashift.subsets import candidate_memberships, image_classes
from shiftbench.metashift.tasks import TaskData, build_task
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.tables.streamed import StreamedTable, arrow_schema, float_column, regroup, strings_in_runs
from shiftbench.warehouse.magnitudes import SCOPE_ALL, magnitudes_table

if TYPE_CHECKING:
    from shiftbench.metashift.classes import ClassResult

FAMILY = "metashift"
# The shift measures of MetaShift tasks and collections (spectral-embedding distances between subsets / communities).
MEASURES = {
    "spectral_distance": "MetaShift task: the task's distance d between its training and test communities "
    "(the paper's definition, as recorded in metashift_tasks.distance)",
    "community_distance": "MetaShift task: distance of one community (scope) to the test community",
    "subset_distance_mean": "MetaShift collection: mean spectral distance between subsets of a class, over the "
    "pairs in metashift_distances (scope all: every class; else one class)",
    "subset_distance_median": "MetaShift collection: median of those distances",
    "subset_distance_p90": "MetaShift collection: 90th percentile of those distances",
    "subset_distance_max": "MetaShift collection: largest of those distances",
}


def distances_table(results: Mapping[str, ClassResult]) -> StreamedTable:
    """Every class's pairs, materialized (``store_distances: true``; by default ``metashift_distances`` is a view
    over the embeddings): classes in name order and within a class the subsets in name order, row by row, the
    order the store sorts the table in, so the rows are made from integer codes batch by batch, already sorted.
    Strings exist for one batch at a time (Arrow ``take`` from the subsets' names)."""
    classes = sorted(results)
    orders = [name_order(results[c].graph.nodes) for c in classes]
    names = pa.array(
        [results[c].graph.nodes[k] for c, order in zip(classes, orders, strict=True) for k in order.tolist()],
        type=pa.large_string(),
    )
    first = np.cumsum([0] + [len(order) for order in orders])
    class_names = pa.array(classes, type=pa.large_string())
    height = sum(len(order) * (len(order) - 1) // 2 for order in orders)

    def pieces() -> Iterator[tuple[np.ndarray, ...]]:
        for k, name in enumerate(classes):
            pairs = em.pair_distances(results[name].embedding, orders[k])
            start = first[k]
            yield (
                np.full(len(pairs.raw), k, dtype=np.int32),
                pairs.i + start,
                pairs.j + start,
                pairs.raw,
                pairs.status_code,
            )

    def batches(rows: int) -> Iterator[pa.Table]:
        for codes in regroup(pieces(), rows):
            class_code, a, b, raw, status = codes
            columns = [
                strings_in_runs(class_names, class_code),
                strings_in_runs(names, a),  # a class's pairs come row by row: subset_a in runs too
                names.take(b),
                float_column(raw, status != 0),
                float_column(raw),
                strings_in_runs(STATUS_NAMES, status),
            ]
            # Dropped before the next batch is made, not when the loop rebinds them: a batch is ~240 MB of strings.
            del codes, class_code, a, b, raw, status
            yield pa.Table.from_arrays(columns, schema=DISTANCE_ARROW)
            del columns

    return StreamedTable(DISTANCE_SCHEMA, height, batches)


def name_order(names: list[str]) -> np.ndarray:
    """Node indices in subset-name order: the order of a class's rows in ``metashift_distances``."""
    return np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)


class NullCounts(Protocol):
    """What the warnings need of a collection's distances."""

    @property
    def null_statuses(self) -> dict[str, int]: ...  # NULL distances by status

    @property
    def total(self) -> int: ...


def task_magnitudes(summary_row: Mapping[str, Any], communities: pl.DataFrame) -> pl.DataFrame:
    """The task's distance d, and each community's distance to the test community."""
    rows: list[tuple[str, str, float | None]] = [("spectral_distance", SCOPE_ALL, summary_row["distance"])]
    measured = communities.filter(pl.col("distance").is_not_null()).sort("community")
    rows += [("community_distance", c, d) for c, d in measured.select("community", "distance").iter_rows()]
    return magnitudes_table(FAMILY, rows)


NULL_DISTANCE_WARNING_SHARE = 0.5


def distance_warnings(distances: NullCounts, embedding: str) -> list[str]:
    """Say loudly when most distances of a collection are NULL (published, but mostly unusable).

    Sparse meta-graphs (high ``edge_threshold``, attribute contexts) split into many components,
    and in ``networkx`` mode a graph with several zero eigenvalues is embedded as a whole, so
    most of its pairs are flagged; the user should know before picking tasks from it.
    """
    if distances.total == 0:
        return ["no distances: no class has two or more selected subsets"]
    n_null = sum(distances.null_statuses.values())
    share = n_null / distances.total
    if share <= NULL_DISTANCE_WARNING_SHARE:
        return []
    counts = sorted(distances.null_statuses.items(), key=lambda item: (-item[1], item[0]))
    reasons = ", ".join(f"{status} {n:,}" for status, n in counts)
    hint = (
        " (networkx mode embeds each meta-graph as a whole: use embedding=paper for per-component distances)"
        if embedding == "networkx"
        else " (meta-graphs are split into components: a lower edge_threshold joins more of them)"
    )
    return [f"{n_null:,} of {distances.total:,} distances ({share:.0%}) are NULL: {reasons}{hint}"]


DISTANCE_SCHEMA = pl.Schema(
    {
        "class": pl.String(),
        "subset_a": pl.String(),
        "subset_b": pl.String(),
        "distance": pl.Float64(),
        "raw_distance": pl.Float64(),
        "status": pl.String(),
    }
)
# The Arrow schemas of the streamed tables: polars' own export of these schemas (same fingerprints).
DISTANCE_ARROW = arrow_schema(DISTANCE_SCHEMA)
STATUS_NAMES = pa.array(em.STATUSES, type=pa.large_string())
COMMUNITY_SCHEMA = pl.Schema(
    {
        "class": pl.String(),
        "subset": pl.String(),
        "community": pl.Int32(),
        "community_name": pl.String(),
        "community_size": pl.Int32(),
    }
)
EMBEDDING_SCHEMA = pl.Schema(
    {
        "class": pl.String(),
        "subset": pl.String(),
        "component": pl.Int32(),
        "embedding": pl.List(pl.Float64),
        "status": pl.String(),
    }
)
GRAPH_SCHEMA = pl.Schema(
    {
        "class": pl.String(),
        "n_subsets": pl.Int32(),
        "n_edges": pl.Int64(),
        "n_components": pl.Int32(),
        "largest_component": pl.Int32(),
        "n_communities": pl.Int32(),
        "modularity": pl.Float64(),
        "status": pl.String(),
        "eigenvalues": pl.List(pl.Float64),
    }
)
TASK_SCHEMA = pl.Schema(
    {
        "task_kind": pl.String(),
        "classes": pl.List(pl.String),
        "distance_class": pl.String(),
        "distance": pl.Float64(),
        "distance_status": pl.String(),
        "paper_distance": pl.Float64(),
        "minority_fraction": pl.Float64(),
        "n_train": pl.Int64(),
        "n_id_val": pl.Int64(),
        "n_val": pl.Int64(),
        "n_test": pl.Int64(),
        "scaled_down": pl.Boolean(),
    }
)


def task_data(
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    spec: TaskSpec,
    general_contexts: Mapping[str, Sequence[str]],
    class_groups: pl.DataFrame | None = None,
) -> TaskData:
    """Images per candidate subset of the task's classes, and per class."""
    if isinstance(objects, pl.DataFrame):
        objects = CodedObjects.from_strings(objects)
    classes = image_classes(objects, class_groups, spec.classes)
    relevant = objects.with_images(classes["image"].unique().to_numpy())
    memberships = candidate_memberships(relevant, images, spec.context_kinds, general_contexts, class_groups).frame()
    subset_images = {
        str(key[0]): frozenset(frame["image_id"].to_list())
        for key, frame in memberships.select("subset", "image_id").partition_by("subset", as_dict=True).items()
    }
    class_images = {
        str(key[0]): frozenset(frame["image_id"].to_list())
        for key, frame in classes.select("class", "image_id").partition_by("class", as_dict=True).items()
    }
    return TaskData(subset_images, class_images)


def task_tables(
    spec: TaskSpec,
    data: TaskData,
    dataset: str,
    example_id_format: str,
    sources: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, pl.DataFrame]:
    """All tables of one task version (without ``version``)."""
    return task_version(spec, data, dataset, example_id_format, sources, overrides)[0]


def task_version(
    spec: TaskSpec,
    data: TaskData,
    dataset: str,
    example_id_format: str,
    sources: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """All tables of one task version (without ``version``), and what its manifest carries besides the usual:
    a conflicts task's ``subsets`` descriptor (:func:`shiftbench.metashift.conflicts.descriptor`), else nothing."""
    manifest_extra: dict[str, Any] = {}
    if spec.kind == "conflicts":
        result, manifest_extra = build_conflicts(spec, data)
    else:
        result = build_task(spec, data)
    examples = result.examples.select(
        pl.lit(FAMILY).alias("family"),
        pl.lit(dataset).alias("dataset"),
        pl.format(example_id_format, pl.col("image_id")).alias("example_id"),
        "split",
        "y",
        "y_name",
        "group",
    )
    params = {**spec.params(), **result.notes, "overrides": dict(overrides or {})}
    tables = {
        "benchmarks": benchmarks_row(FAMILY, spec.name, params, sources, examples.height),
        "examples": examples,
        "metashift_tasks": pl.DataFrame([result.summary], schema=TASK_SCHEMA),
        "metashift_task_communities": result.communities,
        "shift_magnitudes": task_magnitudes(result.summary, result.communities),
    }
    return tables, manifest_extra
