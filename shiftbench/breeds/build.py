"""BREEDS family: from a calibrated hierarchy and an image list to the published tables.

Dataset card
------------
- Source: BREEDS (Santurkar, Tsipras, Madry, ICLR 2021), code and hierarchy MIT-licensed;
  images are ImageNet ILSVRC-2012 (research use).
- Task: classify *superclasses* (e.g. "dog"); each superclass is a set of ImageNet classes, its
  *subpopulations*. Source and target domains hold disjoint subpopulations.
- Splits (WILDS names): source-train -> ``train``, source-val -> ``id_test``,
  target-val -> ``test``, target-train -> ``ood_train`` (for last-layer retraining). A
  ``nosplit`` benchmark has domain ``all``: train -> ``train``, val -> ``id_test``.
- ``y`` is the superclass label, ``group`` the subclass wnid (worst-group = worst subpopulation).

Tables: ``benchmarks`` (one row), ``examples``, ``breeds_subpopulations``, ``breeds_hierarchy``,
``shift_magnitudes`` (hierarchy distance from target to source subclasses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import networkx as nx
import polars as pl

from shiftbench.breeds.calibrated import CalibratedHierarchy
from shiftbench.breeds.novel import build_novel_task
from shiftbench.breeds.specs import BreedsSpec
from shiftbench.breeds.tasks import SuperclassSplit, build_task
from shiftbench.families.benchmarks_table import benchmarks_row
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.warehouse.magnitudes import SCOPE_ALL, magnitudes_table

FAMILY = "breeds"
# The shift measures of a BREEDS benchmark (subpopulation shift inside each superclass, on the calibrated hierarchy).
MEASURES = {
    "subclass_distance_mean": "BREEDS: hierarchy distance (edges on the path through the lowest common ancestor) "
    "from each target subclass to the nearest source subclass of its superclass, averaged over target subclasses "
    "(0 for a nosplit benchmark, whose source and target are the same subclasses)",
    "subclass_distance_max": "BREEDS: the largest of those distances",
}
DATASET = "imagenet"

_SUBPOPULATION_SCHEMA = {
    "y": pl.Int32,
    "superclass_wnid": pl.String,
    "superclass_name": pl.String,
    "subclass_wnid": pl.String,
    "subclass_name": pl.String,
    "domain": pl.String,
    "rank": pl.Int32,
}


def subpopulations_table(task: list[SuperclassSplit], hierarchy: Hierarchy, split: str) -> pl.DataFrame:
    rows: list[tuple[Any, ...]] = []
    for sup in task:
        sides = [("all", sup.source)] if split == "none" else [("source", sup.source), ("target", sup.target)]
        for domain, subclasses in sides:
            for rank, wnid in enumerate(subclasses):
                rows.append(
                    (
                        sup.label,
                        sup.superclass,
                        hierarchy.name(sup.superclass),
                        wnid,
                        hierarchy.name(wnid),
                        domain,
                        rank,
                    )
                )
    return pl.DataFrame(rows, schema=_SUBPOPULATION_SCHEMA, orient="row")


def examples_table(subpopulations: pl.DataFrame, images: pl.DataFrame, dataset: str = DATASET) -> pl.DataFrame:
    """Every known image of every subpopulation, with its WILDS split."""
    joined = images.join(
        subpopulations.select(
            pl.col("subclass_wnid").alias("wnid"), "y", pl.col("superclass_name").alias("y_name"), "domain"
        ),
        on="wnid",
        how="inner",
        validate="m:1",
    )
    in_source = pl.col("domain").is_in(["source", "all"])
    is_train = pl.col("imagenet_split") == "train"
    split = (
        pl.when(in_source & is_train)
        .then(pl.lit("train"))
        .when(in_source)
        .then(pl.lit("id_test"))
        .when(is_train)
        .then(pl.lit("ood_train"))
        .otherwise(pl.lit("test"))
    )
    return joined.select(
        pl.lit(FAMILY).alias("family"),
        pl.lit(dataset).alias("dataset"),
        pl.col("image_id").alias("example_id"),
        split.alias("split"),
        pl.col("y").cast(pl.Int32),
        "y_name",
        pl.col("wnid").alias("group"),
    )


def hierarchy_table(hierarchy: Hierarchy) -> pl.DataFrame:
    levels = hierarchy.levels
    parents = [p for p, _ in hierarchy.edges]
    children = [c for _, c in hierarchy.edges]
    return pl.DataFrame(
        {
            "parent": parents,
            "child": children,
            "parent_name": [hierarchy.name(p) for p in parents],
            "child_name": [hierarchy.name(c) for c in children],
            "child_level": [levels[c] for c in children],
        },
        schema={
            "parent": pl.String,
            "child": pl.String,
            "parent_name": pl.String,
            "child_name": pl.String,
            "child_level": pl.Int32,
        },
    )


def subclass_distances(task: list[SuperclassSplit], hierarchy: Hierarchy) -> pl.DataFrame:
    """Per target subclass: edges on the hierarchy path to the nearest source subclass of its superclass.

    Paths run through the superclass's part of the hierarchy (undirected), so a distance is that of
    the lowest common ancestor in a tree (computed so when the hierarchy is one: ImageNet-21k's tens of
    thousands of classes). A nosplit superclass has no target: its distances are 0.
    """
    distance = _tree_distance(hierarchy) if hierarchy.is_tree() else None
    graph = hierarchy.graph
    rows: list[tuple[str, str, int]] = []
    for sup in task:
        if not sup.target:
            rows.extend((sup.superclass, wnid, 0) for wnid in sup.source)
            continue
        if distance is not None:
            rows.extend((sup.superclass, t, min(distance(t, s) for s in sup.source)) for t in sup.target)
            continue
        below = graph.subgraph(nx.descendants(graph, sup.superclass) | {sup.superclass}).to_undirected(as_view=True)
        sources = set(sup.source)
        for wnid in sup.target:
            lengths = nx.single_source_shortest_path_length(below, wnid)
            rows.append((sup.superclass, wnid, min(lengths[s] for s in sources if s in lengths)))
    return pl.DataFrame(
        rows, schema={"superclass_wnid": pl.String, "subclass_wnid": pl.String, "distance": pl.Int64}, orient="row"
    )


def _tree_distance(hierarchy: Hierarchy) -> Callable[[str, str], int]:
    """Edges between two nodes of a tree: depth(a) + depth(b) - 2 depth(lowest common ancestor)."""
    graph, levels = hierarchy.graph, hierarchy.levels
    parent = {child: p for p, child in graph.edges}

    def path_up(node: str) -> list[str]:
        path = [node]
        while path[-1] in parent:
            path.append(parent[path[-1]])
        return path

    def distance(a: str, b: str) -> int:
        above_a = set(path_up(a))
        common = next(node for node in path_up(b) if node in above_a)
        return levels[a] + levels[b] - 2 * levels[common]

    return distance


def magnitudes(task: list[SuperclassSplit], hierarchy: Hierarchy) -> pl.DataFrame:
    distances = subclass_distances(task, hierarchy)
    rows: list[tuple[str, str, float | None]] = [
        ("subclass_distance_mean", SCOPE_ALL, float(distances["distance"].mean() or 0)),  # type: ignore[arg-type]
        ("subclass_distance_max", SCOPE_ALL, float(distances["distance"].max() or 0)),  # type: ignore[arg-type]
    ]
    per_superclass = distances.group_by("superclass_wnid").agg(pl.col("distance").mean()).sort("superclass_wnid")
    for superclass, mean in per_superclass.iter_rows():
        rows.append(("subclass_distance_mean", superclass, mean))
    return magnitudes_table(FAMILY, rows)


def build_tables(
    spec: BreedsSpec,
    calibrated: CalibratedHierarchy,
    images: pl.DataFrame,
    image_sources: Mapping[str, Any],
    *,
    overrides: Mapping[str, Any] | None = None,
    dataset: str = DATASET,
    seen: Sequence[str] = (),
) -> dict[str, pl.DataFrame]:
    """All tables of one BREEDS benchmark version (without the ``version`` column).

    ``seen``: the ImageNet-1k classes, the source side of a novel-subpopulations task.
    """
    classes = calibrated.classes_in_hierarchy
    if spec.task == "novel":
        seen_here = [c for c in seen if c in calibrated.hierarchy.graph]
        restricted = calibrated.hierarchy.restrict_to_ancestors([*classes, *seen_here])
        seen_set = set(seen_here)
        unseen = [c for c in classes if c not in seen_set]
        given = dict(spec.source_subclasses) if spec.source_subclasses is not None else None
        task = build_novel_task(restricted, seen_here, unseen, spec.task_params(), given)
    else:
        restricted = calibrated.hierarchy.restrict_to_ancestors(classes)
        task = build_task(restricted, classes, spec.task_params())
    subpopulations = subpopulations_table(task, restricted, spec.split)
    examples = examples_table(subpopulations, images, dataset)
    counts = examples.group_by("group").agg(pl.len().alias("n_images")).rename({"group": "subclass_wnid"})
    subpopulations = subpopulations.join(counts, on="subclass_wnid", how="left").with_columns(
        pl.col("n_images").fill_null(0).cast(pl.Int64)
    )
    params = {**spec.params(), "hierarchy": calibrated.kind, "overrides": dict(overrides or {})}
    sources = {**calibrated.sources, **image_sources}
    benchmarks = benchmarks_row(FAMILY, spec.name, params, sources, examples.height)
    return {
        "benchmarks": benchmarks,
        "examples": examples,
        "breeds_subpopulations": subpopulations,
        "breeds_hierarchy": hierarchy_table(restricted),
        "shift_magnitudes": magnitudes(task, restricted),
    }
