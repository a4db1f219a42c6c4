"""MetaShift family: from scene tables to the published tables of a collection or a task.

Dataset card
------------
- Source: MetaShift (Liang & Zou, ICLR 2022), CC BY 4.0; annotations are Visual Genome / GQA
  scene graphs (CC BY 4.0), a user's tag table, or the generated sample (not real data).
- A *collection* (``metashift``, ``metashift-attributes``) is the set of candidate subsets with
  their meta-graphs, communities, spectral embeddings and pairwise distances. It has no
  examples of its own.
- A *task* is a benchmark with examples. Splits (WILDS names): domain generalization: train
  communities -> ``train``, test communities -> ``test``, the released scripts' additional test
  communities -> ``val`` (OOD validation); subpopulation shift: ``train`` (minority fraction p)
  and a balanced ``test``; ``id_val`` holds ``id_val_fraction`` of each training community.
- ``y`` is the class index in the task's ``classes``; ``group`` the community an image was drawn from.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from threadpoolctl import threadpool_limits

from shiftbench.errors import InputError
from shiftbench.fingerprint import canonical_json
from shiftbench.magnitudes import SCOPE_ALL, exact_sum, magnitudes_table, summary
from shiftbench.memory import release_freed_memory
from shiftbench.metashift import embedding as em
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.specs import CollectionSpec, TaskSpec
from shiftbench.metashift.subsets import SUBSET_COLUMNS, Memberships, candidate_memberships, image_classes, subset_table
from shiftbench.metashift.tasks import TaskData, build_task
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.streamed import StreamedTable, arrow_schema, float_column, regroup, strings_in_runs

FAMILY = "metashift"
_BENCHMARK_SCHEMA = {
    "family": pl.String(),
    "spec": pl.String(),
    "params": pl.String(),
    "sources": pl.String(),
    "n_examples": pl.Int64(),
}


def benchmarks_row(
    spec_name: str, params: Mapping[str, Any], sources: Mapping[str, Any], n_examples: int
) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "family": [FAMILY],
            "spec": [spec_name],
            "params": [canonical_json(dict(params))],
            "sources": [canonical_json(dict(sources))],
            "n_examples": [n_examples],
        },
        schema=_BENCHMARK_SCHEMA,
    )


@dataclass(frozen=True)
class ClassResult:
    graph: mg.ClassGraph
    communities: list[list[str]]
    embedding: em.Embedding

    def name_order(self) -> np.ndarray:
        """Node indices in subset-name order: the order of the class's rows in ``metashift_distances``."""
        names = self.graph.nodes
        return np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)


def _class_results(spec: CollectionSpec, nodes: pl.DataFrame, edges: pl.DataFrame) -> dict[str, ClassResult]:
    """Communities and embeddings of every class.

    The embeddings (LAPACK, which releases the GIL) run on one thread per core, largest classes first, while
    this thread finds the communities. Each LAPACK call runs single-threaded: OpenBLAS's results depend on how
    many threads it splits a matrix among (at GQA scale 115 of 1,596 classes got other eigenvector signs or last
    bits with 2 threads than with 1), so the published version would depend on the machine's core count.
    """
    graphs = mg.class_graphs(nodes, edges)
    largest_first = sorted(graphs, key=lambda name: -len(graphs[name].nodes))
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        embeddings = {
            name: pool.submit(em.embed, graphs[name].weights, spec.embedding_dim, spec.embedding)
            for name in largest_first
        }
        communities = {name: mg.detect_communities(graphs[name], spec.community_method, spec.seed) for name in graphs}
        return {name: ClassResult(graphs[name], communities[name], embeddings[name].result()) for name in graphs}


def _distances_table(results: Mapping[str, ClassResult]) -> StreamedTable:
    """Every class's pairs, classes in name order and within a class the subsets in name order, row by row: the
    order the store sorts the table in, so the rows are made from integer codes batch by batch, already sorted.
    Strings exist for one batch at a time (Arrow ``take`` from the subsets' names)."""
    classes = sorted(results)
    orders = [results[c].name_order() for c in classes]
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


def _subset_images_table(memberships: Memberships) -> StreamedTable:
    """(subset, image_id) from the memberships' codes, which are sorted by subset then image: the store's order."""
    names = memberships.subsets["subset"]
    image_ids = memberships.image_ids
    subset_codes = memberships.pairs["subset"].to_numpy()
    image_codes = memberships.pairs["image"].to_numpy()
    height = memberships.height

    def batches(rows: int) -> Iterator[pa.Table]:
        # Arrow copies of the names only while the table is read (they are not held while others are hashed)
        subsets = names.to_arrow(compat_level=pl.CompatLevel.oldest())
        images = image_ids.to_arrow(compat_level=pl.CompatLevel.oldest())
        for start in range(0, height, rows):
            end = start + rows
            columns = [subsets.take(subset_codes[start:end]), images.take(image_codes[start:end])]
            yield pa.Table.from_arrays(columns, schema=MEMBERSHIP_ARROW)
            del columns  # not held while the next batch is made

    return StreamedTable(MEMBERSHIP_SCHEMA, height, batches)


@dataclass(frozen=True)
class DistanceCounts:
    """What the warnings need of a collection's distances."""

    null_statuses: dict[str, int]  # NULL distances by status
    total: int


@dataclass(frozen=True)
class DistanceSummary(DistanceCounts):
    """What the collection's magnitudes and warnings need of its distances, gathered without their strings."""

    values: np.ndarray  # every defined distance, class by class (hundreds of MB at GQA scale: dropped once used)
    class_sums: dict[str, tuple[float, int]]  # exactly rounded sum and count of each class's defined distances


def summarise_distances(results: Mapping[str, ClassResult]) -> DistanceSummary:
    # One array for every pair, filled class by class (a list of the classes' arrays joined at the end held the
    # 27 M distances of a GQA-scale collection twice); the pairs without a distance are cut off the end.
    values = np.empty(sum(len(r.graph.nodes) * (len(r.graph.nodes) - 1) // 2 for r in results.values()), dtype=float)
    class_sums, nulls, filled = {}, Counter[str](), 0
    for name in sorted(results):
        pairs = em.pair_distances(results[name].embedding)
        missing = np.isnan(pairs.distance)
        known = pairs.distance[~missing]
        values[filled : filled + len(known)] = known
        filled += len(known)
        if len(known):
            class_sums[name] = (exact_sum(known), len(known))
        counts = np.bincount(pairs.status_code[missing], minlength=len(em.STATUSES))
        nulls.update({status: int(n) for status, n in zip(em.STATUSES, counts.tolist(), strict=True) if n})
    return DistanceSummary(dict(nulls), len(values), values[:filled], class_sums)


def collection_tables(
    spec: CollectionSpec,
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    sources: Mapping[str, Any],
    class_groups: pl.DataFrame | None = None,
) -> tuple[dict[str, pl.DataFrame | StreamedTable], dict[str, ClassResult], DistanceCounts]:
    """All tables of one collection version (without ``version``), the per-class graphs, and how many distances
    are NULL and why (for the warnings).

    ``metashift_subset_images`` and ``metashift_distances`` are streamed tables (:class:`StreamedTable`), made from
    integer codes and the embeddings whenever they are read (at GQA scale they have tens of millions of
    rows); the other tables are data frames.
    """
    memberships = candidate_memberships(objects, images, spec.context_kinds, general_contexts, class_groups)
    release_freed_memory()  # each stage's temporaries, before the next adds its own peak (shiftbench.memory)
    subsets = subset_table(memberships, spec.min_subset_size, spec.min_subsets_per_class)
    if not subsets["selected"].any():  # an empty collection would publish as a result: refuse it
        largest = int(subsets.select(pl.col("n_images").max()).item() or 0) if subsets.height else 0
        raise InputError(
            f"no class has {spec.min_subsets_per_class} subsets of {spec.min_subset_size} or more images "
            f"({subsets.height:,} candidate subsets, the largest has {largest:,}): lower min_subset_size or "
            "min_subsets_per_class",
            parameter="min_subset_size",
        )
    nodes = mg.node_order(subsets.filter(pl.col("selected")))
    edges = mg.overlap_edges(memberships, nodes, spec.edge_threshold)
    release_freed_memory()
    results = _class_results(spec, nodes, edges)
    release_freed_memory()

    community_rows, embedding_rows, graph_rows = [], [], []
    for name, result in sorted(results.items()):
        graph, emb = result.graph, result.embedding
        size_of = dict(zip(graph.nodes, graph.sizes.tolist(), strict=True))
        for number, members in enumerate(result.communities):
            label = min(members, key=lambda m: (-size_of[m], m))  # the largest member names it
            for member in members:
                community_rows.append((name, member, number, label, len(members)))
        for k, subset in enumerate(graph.nodes):
            embedding_rows.append(
                (name, subset, int(emb.component[k]), [float(x) for x in emb.coords[k]], str(emb.component_status[k]))
            )
        n_components = int(emb.component.max()) + 1 if len(graph.nodes) else 0
        largest = int(np.sum(emb.component == 0))
        statuses = sorted(set(emb.component_status.tolist()) - {"ok"})
        graph_rows.append(
            (
                name,
                len(graph.nodes),
                int(graph.weights.nnz // 2),
                n_components,
                largest,
                len(result.communities),
                mg.modularity(graph, result.communities),
                statuses[0] if statuses else "ok",
                emb.eigenvalues[0] if emb.eigenvalues else [],
            )
        )
    tables: dict[str, pl.DataFrame | StreamedTable] = {
        "benchmarks": benchmarks_row(spec.name, {**spec.params(), "kind": "collection"}, sources, 0),
        "metashift_subsets": subsets.select(SUBSET_COLUMNS),
        "metashift_subset_images": _subset_images_table(memberships),
        "metashift_edges": edges,
        "metashift_distances": _distances_table(results),
        "metashift_communities": pl.DataFrame(community_rows, schema=COMMUNITY_SCHEMA, orient="row"),
        "metashift_embeddings": pl.DataFrame(embedding_rows, schema=EMBEDDING_SCHEMA, orient="row"),
        "metashift_graphs": pl.DataFrame(graph_rows, schema=GRAPH_SCHEMA, orient="row"),
    }
    distances = summarise_distances(results)
    tables["shift_magnitudes"] = collection_magnitudes(distances)
    counts = DistanceCounts(distances.null_statuses, distances.total)
    del distances  # every distance, once more: gone before the tables are hashed and written
    release_freed_memory()
    return tables, results, counts


def collection_magnitudes(distances: DistanceSummary) -> pl.DataFrame:
    """The distribution of subset distances: over every class (scope ``all``), and each class's mean."""
    rows = summary(pl.Series(distances.values, dtype=pl.Float64), "subset_distance", SCOPE_ALL)
    # Each class's mean with an exactly rounded sum (math.fsum): the same value whatever order the
    # distances come in (a parallel group_by once changed its last bits, and the version id, between runs).
    for name, (total, count) in sorted(distances.class_sums.items()):
        rows.append(("subset_distance_mean", name, total / count))
    return magnitudes_table(FAMILY, rows)


def task_magnitudes(summary_row: Mapping[str, Any], communities: pl.DataFrame) -> pl.DataFrame:
    """The task's distance d, and each community's distance to the test community."""
    rows: list[tuple[str, str, float | None]] = [("spectral_distance", SCOPE_ALL, summary_row["distance"])]
    measured = communities.filter(pl.col("distance").is_not_null()).sort("community")
    rows += [("community_distance", c, d) for c, d in measured.select("community", "distance").iter_rows()]
    return magnitudes_table(FAMILY, rows)


NULL_DISTANCE_WARNING_SHARE = 0.5


def distance_warnings(distances: DistanceCounts, embedding: str) -> list[str]:
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
MEMBERSHIP_SCHEMA = pl.Schema({"subset": pl.String(), "image_id": pl.String()})
# The Arrow schemas of the streamed tables: polars' own export of these schemas (same fingerprints).
DISTANCE_ARROW = arrow_schema(DISTANCE_SCHEMA)
MEMBERSHIP_ARROW = arrow_schema(MEMBERSHIP_SCHEMA)
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
    return {
        "benchmarks": benchmarks_row(spec.name, params, sources, examples.height),
        "examples": examples,
        "metashift_tasks": pl.DataFrame([result.summary], schema=TASK_SCHEMA),
        "metashift_task_communities": result.communities,
        "shift_magnitudes": task_magnitudes(result.summary, result.communities),
    }
