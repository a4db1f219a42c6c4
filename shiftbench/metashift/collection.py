"""A MetaShift collection: classes built one by one from the scene index, assembled into linear tables.

What a collection stores grows with its inputs, never with pairs of subsets:

- ``metashift_subsets``: the selected subsets (and the large subsets of classes with too few of them), with
  their class and context codes; candidates that were not selected are counted per class in
  ``metashift_classes``, not listed;
- ``metashift_edges``, ``metashift_communities``, ``metashift_embeddings``, ``metashift_graphs``: the
  thresholded meta-graphs, their communities, the spectral embedding of every selected subset with its
  component and the status that makes a distance NULL;
- the annotations the selected subsets are made of, integer-coded (``metashift_scene_images``,
  ``metashift_scene_objects``, ``metashift_scene_contexts``, ``metashift_scene_attributes``,
  ``metashift_scene_class_names``,
  ``metashift_scene_vocabulary``): the view ``metashift_subset_images`` lists a selected subset's images
  from them;
- ``shift_magnitudes``: the distribution of the distances, computed here in two passes over the classes
  (exact order statistics, no array of every distance).

``metashift_distances`` is a view computing Euclidean distances from the embeddings when queried
(``data_contracts/metashift/<table>.sql``); ``store_distances: true`` also materializes it, for small collections.

Classes are independent (:mod:`shiftbench.metashift.classes`): :func:`build_classes` runs them on threads
(compiled loops and LAPACK release the GIL), :func:`build_bucket` runs one bucket of them from a saved index,
in another process or a Dagster step; any grouping gives the same tables, hence the same version id.
"""

from __future__ import annotations

import os
import pickle
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
from scipy.spatial.distance import pdist
from threadpoolctl import threadpool_limits

from shiftbench.errors import InputError
from shiftbench.families.benchmarks_table import benchmarks_row
from shiftbench.metashift import build
from shiftbench.metashift import embedding as em
from shiftbench.metashift.classes import (
    ClassOutcome,
    ClassResult,
    ClassSettings,
    build_class,
    edge_table,
    listed_table,
)
from shiftbench.metashift.index import SceneIndex, build_index
from shiftbench.metashift.scope import Scope, resolve_scope
from shiftbench.metashift.specs import CollectionSpec
from shiftbench.metashift.subsets import CONTEXT_KINDS, SUBSET_COLUMNS
from shiftbench.runtime.memory import release_freed_memory
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.tables.streamed import StreamedTable
from shiftbench.warehouse.magnitudes import SCOPE_ALL, OrderStatistics, ValuesPart, in_bins, magnitudes_table

T = TypeVar("T")


def known_classes(objects: CodedObjects, class_groups: pl.DataFrame | None) -> pl.Series:
    """The names a class list may use: the object names of the annotations, or the class groups."""
    if class_groups is not None:
        return class_groups["class"].unique().sort()
    return objects.vocabulary.gather(objects.frame["name"].unique().sort()).rename("class")


def prepare(
    spec: CollectionSpec,
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    class_groups: pl.DataFrame | None = None,
) -> tuple[SceneIndex, Scope]:
    """The collection's scope (its class list checked against the annotations) and its scene index."""
    if isinstance(objects, pl.DataFrame):
        objects = CodedObjects.from_strings(objects)
    scope = resolve_scope(
        spec.classes, spec.classes_file, spec.max_contexts_per_class, known_classes(objects, class_groups)
    )
    index = build_index(objects, images, spec.context_kinds, general_contexts, class_groups, scope.classes)
    return index, scope


def _work_order(index: SceneIndex, codes: Sequence[int]) -> list[int]:
    """Largest classes first (ties by code): a long class starts early instead of ending the build alone."""
    sizes = np.diff(index.class_image_offsets)
    return sorted((int(c) for c in codes), key=lambda c: (-int(sizes[c]), c))


def build_classes(
    index: SceneIndex, settings: ClassSettings, codes: Sequence[int] | None = None, workers: int | None = None
) -> list[ClassOutcome]:
    """Every class of ``codes`` (default: all), on ``workers`` threads (default: one per core), in code order.

    Each LAPACK call runs on one thread: OpenBLAS's results depend on how many threads share a matrix (at GQA
    scale 115 of 1,596 classes got other eigenvector signs or last bits with 2 threads than with 1), so a version
    id would otherwise depend on the machine's core count.
    """
    codes = list(index.classes) if codes is None else list(codes)
    scratch: dict[int, np.ndarray] = {}

    def one(code: int) -> ClassOutcome:
        import threading

        counts = scratch.setdefault(threading.get_ident(), np.zeros(len(index.vocabulary), dtype=np.int64))
        return build_class(index, code, settings, counts)

    with (
        threadpool_limits(limits=1, user_api="blas"),
        ThreadPoolExecutor(max_workers=workers or os.cpu_count()) as pool,
    ):
        futures = {code: pool.submit(one, code) for code in _work_order(index, codes)}
        return [futures[int(code)].result() for code in sorted(int(c) for c in codes)]


def buckets(index: SceneIndex, n_buckets: int) -> list[list[int]]:
    """The classes in ``n_buckets`` groups of about equal work (largest first, each to the lightest bucket);
    deterministic, and any grouping builds the same tables."""
    sizes = np.diff(index.class_image_offsets)
    loads = [0] * n_buckets
    groups: list[list[int]] = [[] for _ in range(n_buckets)]
    for code in _work_order(index, index.classes.tolist()):
        lightest = min(range(n_buckets), key=lambda b: (loads[b], b))
        groups[lightest].append(code)
        loads[lightest] += int(sizes[code]) + 1
    return [sorted(group) for group in groups if group]


def build_bucket(index_dir: Path, settings: ClassSettings, codes: Sequence[int], out: Path, workers: int = 1) -> Path:
    """One bucket of classes from a saved index (another process, a Dagster step), its outcomes pickled to ``out``."""
    index = SceneIndex.load(index_dir)
    outcomes = build_classes(index, settings, codes, workers=workers)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(pickle.dumps(outcomes, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(out)
    return out


def read_buckets(paths: Sequence[Path]) -> list[ClassOutcome]:
    """The outcomes of every bucket, in class code order (the order of one piece)."""
    outcomes: list[ClassOutcome] = []
    for path in paths:
        outcomes += pickle.loads(path.read_bytes())
    return sorted(outcomes, key=lambda o: o.class_code)


def build_collection(
    spec: CollectionSpec,
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    sources: Mapping[str, Any],
    class_groups: pl.DataFrame | None = None,
    *,
    n_buckets: int = 0,
    work_dir: Path | None = None,
) -> tuple[dict[str, pl.DataFrame | StreamedTable], dict[str, ClassResult], DistanceCounts]:
    """Prepare, build every class (threads; or ``n_buckets`` buckets in worker processes, from the index saved
    under ``work_dir``) and assemble the tables."""
    index, scope = prepare(spec, objects, images, general_contexts, class_groups)
    del objects
    release_freed_memory()
    settings = ClassSettings.of(spec)
    if n_buckets <= 0:
        outcomes = build_classes(index, settings)
    else:
        outcomes = build_in_processes(index, settings, n_buckets, work_dir)
    return collection_tables(spec, index, scope, outcomes, sources)


def build_in_processes(
    index: SceneIndex, settings: ClassSettings, n_buckets: int, work_dir: Path | None
) -> list[ClassOutcome]:
    """The classes in buckets, each in a worker process reading the index saved once (memory-mapped)."""
    import shutil
    import tempfile

    from loky import ProcessPoolExecutor

    base = Path(tempfile.mkdtemp(prefix="metashift-buckets-", dir=work_dir))
    try:
        index.save(base / "index")
        groups = buckets(index, n_buckets)
        workers = min(len(groups), os.cpu_count() or 1)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(build_bucket, base / "index", settings, group, base / f"bucket-{k}.pickle")
                for k, group in enumerate(groups)
            ]
            paths = [future.result() for future in futures]
        return read_buckets(paths)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class DistanceCounts:
    """What the warnings need of a collection's distances."""

    null_statuses: dict[str, int]  # NULL distances by status
    total: int


def collection_tables(
    spec: CollectionSpec,
    index: SceneIndex,
    scope: Scope,
    outcomes: Sequence[ClassOutcome],
    sources: Mapping[str, Any],
) -> tuple[dict[str, pl.DataFrame | StreamedTable], dict[str, ClassResult], DistanceCounts]:
    """All tables of one collection version (without ``version``), its classes' meta-graphs (for figures), and
    how many distances are NULL and why (for the warnings)."""
    listed = listed_table(index, outcomes)
    if not listed["selected"].any():  # an empty collection would publish as a result: refuse it
        n_candidates = sum(sum(o.counts.values()) for o in outcomes)
        largest = max((o.largest for o in outcomes), default=0)
        raise InputError(
            f"no class has {spec.min_subsets_per_class} subsets of {spec.min_subset_size} or more images "
            f"({n_candidates:,} candidate subsets, the largest has {largest:,}): lower min_subset_size or "
            "min_subsets_per_class",
            parameter="min_subset_size",
        )
    results = {o.class_name: o.result for o in outcomes if o.result is not None}
    distances = distance_statistics(results)
    params = {**spec.params(), **scope.params(), "kind": "collection"}
    tables: dict[str, pl.DataFrame | StreamedTable] = {
        "benchmarks": benchmarks_row(build.FAMILY, spec.name, params, sources, 0),
        "metashift_subsets": listed.sort("class", "subset").select(*SUBSET_COLUMNS),
        "metashift_classes": classes_table(outcomes),
        "metashift_edges": edge_table([r for _, r in sorted(results.items())]),
        **graph_tables(results),
        **scene_tables(index, outcomes, listed),
        "shift_magnitudes": distances.magnitudes,
    }
    if spec.store_distances:
        tables["metashift_distances"] = build.distances_table(results)
    release_freed_memory()
    return tables, results, DistanceCounts(distances.null_statuses, distances.total)


def classes_table(outcomes: Sequence[ClassOutcome]) -> pl.DataFrame:
    rows = [
        (
            o.class_name,
            o.n_images,
            sum(o.counts.values()),
            o.counts["selected"],
            o.counts["too_small"],
            o.counts["capped"],
            o.counts["class_too_few_subsets"],
            o.result is not None,
        )
        for o in sorted(outcomes, key=lambda o: o.class_name)
    ]
    return pl.DataFrame(rows, schema=CLASS_SCHEMA, orient="row")


def graph_tables(results: Mapping[str, ClassResult]) -> dict[str, pl.DataFrame]:
    """Communities, embeddings and one summary row per class meta-graph."""
    community_rows, graph_rows = [], []
    embedding_parts = []
    for name, result in sorted(results.items()):
        graph, emb = result.graph, result.embedding
        size_of = dict(zip(graph.nodes, graph.sizes.tolist(), strict=True))
        for number, members in enumerate(result.communities):
            label = min(members, key=lambda m: (-size_of[m], m))  # the largest member names it
            for member in members:
                community_rows.append((name, member, number, label, len(members)))
        embedding_parts.append((name, graph.nodes, emb))
        n_components = int(emb.component.max()) + 1 if len(graph.nodes) else 0
        statuses = sorted(set(emb.component_status.tolist()) - {"ok"})
        graph_rows.append(
            (
                name,
                len(graph.nodes),
                int(graph.weights.nnz // 2),
                n_components,
                int(np.sum(emb.component == 0)),
                len(result.communities),
                result.modularity,
                statuses[0] if statuses else "ok",
                emb.eigenvalues[0] if emb.eigenvalues else [],
            )
        )
    return {
        "metashift_communities": pl.DataFrame(community_rows, schema=build.COMMUNITY_SCHEMA, orient="row"),
        "metashift_embeddings": _embedding_table(embedding_parts),
        "metashift_graphs": pl.DataFrame(graph_rows, schema=build.GRAPH_SCHEMA, orient="row"),
    }


def _embedding_table(parts: list[tuple[str, list[str], em.Embedding]]) -> pl.DataFrame:
    """One row per embedded subset, made column by column (a list of coordinates per row from one array)."""
    if not parts:
        return pl.DataFrame(schema=build.EMBEDDING_SCHEMA)
    coords = np.vstack([emb.coords for _, _, emb in parts]).astype(np.float64)
    dim = coords.shape[1]
    offsets = np.arange(0, coords.size + 1, dim, dtype=np.int64)
    lists = pl.from_arrow(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(coords.ravel())))
    return pl.DataFrame(
        {
            "class": np.concatenate([np.full(len(nodes), name, dtype=object) for name, nodes, _ in parts]),
            "subset": [node for _, nodes, _ in parts for node in nodes],
            "component": np.concatenate([emb.component for _, _, emb in parts]).astype(np.int32),
            "embedding": lists,
            "status": np.concatenate([emb.component_status for _, _, emb in parts]).astype(str),
        },
        schema=build.EMBEDDING_SCHEMA,
    )


def _gather(offsets: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, value) of the CSR rows ``rows``, in that order."""
    lengths = (offsets[rows + 1] - offsets[rows]).astype(np.int64)
    starts = np.repeat(offsets[rows].astype(np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return np.repeat(rows, lengths), np.asarray(values)[starts + np.arange(int(lengths.sum()))]


def scene_tables(index: SceneIndex, outcomes: Sequence[ClassOutcome], listed: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The integer-coded annotations of the selected subsets: what the view ``metashift_subset_images`` reads.

    Only what selected subsets need: the images that show a class with a meta-graph, the object names that show
    those classes or are selected object contexts, the selected general contexts and attributes.
    """
    kept = [o for o in outcomes if o.result is not None]
    size = len(index.vocabulary)
    classes = np.array([o.class_code for o in kept], dtype=np.int64)
    _, class_images = _gather(index.class_image_offsets, index.class_images, classes)
    shown = np.zeros(index.n_images, dtype=bool)
    shown[class_images] = True
    images = np.flatnonzero(shown)
    del class_images, shown
    names_class, names = _gather(index.class_name_offsets, index.class_names, classes)
    wanted = {kind: np.zeros(size, dtype=bool) for kind in CONTEXT_KINDS}
    for o in kept:
        for kind, codes in o.selected_codes.items():
            wanted[kind][codes] = True
    wanted["object"][names] = True
    pieces = {}
    for kind, offsets, values, column in (
        ("object", index.image_object_offsets, index.image_objects, "name"),
        ("general", index.image_general_offsets, index.image_general, "context"),
    ):
        image, code = _gather(offsets, values, images)
        keep = wanted[kind][code]
        pieces[kind] = pl.DataFrame(
            {"image": image[keep], column: code[keep]}, schema={"image": pl.Int32(), column: pl.Int32()}
        )
    attribute_rows = []
    for o in kept:
        start, end = index.class_attribute_offsets[o.class_code], index.class_attribute_offsets[o.class_code + 1]
        chosen = np.zeros(size, dtype=bool)
        chosen[o.selected_codes["attribute"]] = True
        codes = np.asarray(index.class_attributes[start:end])
        keep = chosen[codes]
        attribute_rows.append(
            pl.DataFrame(
                {
                    "image": np.asarray(index.class_attribute_images[start:end])[keep],
                    "class": o.class_code,
                    "attribute": codes[keep],
                },
                schema=ATTRIBUTE_SCHEMA,
            )
        )
    attributes = pl.concat(attribute_rows) if attribute_rows else pl.DataFrame(schema=ATTRIBUTE_SCHEMA)
    class_names = pl.DataFrame({"class": names_class, "name": names}, schema=CLASS_NAME_SCHEMA)
    in_use = np.zeros(size, dtype=bool)
    for codes in (
        pieces["object"]["name"].to_numpy(),
        pieces["general"]["context"].to_numpy(),
        attributes["class"].to_numpy(),
        attributes["attribute"].to_numpy(),
        names,
        names_class,
        listed["class_code"].to_numpy(),
        listed["context_code"].to_numpy(),
    ):
        in_use[codes] = True
    used = np.flatnonzero(in_use)
    return {
        "metashift_scene_images": pl.DataFrame(
            {"image": images, "image_id": index.image_ids.gather(images)}, schema=IMAGE_SCHEMA
        ),
        "metashift_scene_objects": pieces["object"],
        "metashift_scene_contexts": pieces["general"],
        "metashift_scene_attributes": attributes,
        "metashift_scene_class_names": class_names,
        "metashift_scene_vocabulary": pl.DataFrame(
            {"code": used, "value": index.vocabulary.gather(used)}, schema=VOCABULARY_SCHEMA
        ),
    }


@dataclass(frozen=True)
class DistanceStatistics:
    magnitudes: pl.DataFrame
    null_statuses: dict[str, int]
    total: int


def _defined_distances(embedding: em.Embedding) -> tuple[np.ndarray, np.ndarray]:
    """A class's defined distances (the view's ``distance IS NOT NULL``) and the count of its pairs by status; a
    meta-graph of one component whose status is ok has only defined ones (then the distances alone are made)."""
    n = len(embedding.component)
    if n > 1 and not embedding.component.any() and (embedding.component_status == "ok").all():
        values = pdist(embedding.coords)
        counts = np.zeros(len(em.STATUSES), dtype=np.int64)
        counts[0] = len(values)
        return values, counts
    pairs = em.pair_distances(embedding)
    return pairs.distance[pairs.status_code == 0], np.bincount(pairs.status_code, minlength=len(em.STATUSES))


def _each_class(results: Mapping[str, ClassResult], work: Callable[[em.Embedding], T]) -> Iterator[T]:
    """``work`` on each class's embedding, in name order, on threads (pdist and numpy release the GIL) a few classes
    ahead: never more than a few classes' distances in memory."""
    names = sorted(results)
    ahead = 2 * (os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        pending = deque(pool.submit(work, results[name].embedding) for name in names[:ahead])
        for name in names[ahead:]:
            yield pending.popleft().result()
            pending.append(pool.submit(work, results[name].embedding))
        while pending:
            yield pending.popleft().result()


def _first_pass(embedding: em.Embedding) -> tuple[ValuesPart | None, np.ndarray]:
    known, counts = _defined_distances(embedding)
    return ValuesPart.of(known), counts


def distance_statistics(results: Mapping[str, ClassResult]) -> DistanceStatistics:
    """Mean, median, p90 and max of every defined distance, each class's mean, and the NULLs by status.

    The quantiles are exact order statistics found in two passes over the classes' distances (a histogram of
    their bit patterns, then the values of the few bins holding the ranks wanted), so no array of every
    distance is held: at Open Images' scale there are hundreds of millions.
    """
    nulls = np.zeros(len(em.STATUSES), dtype=np.int64)
    total = 0
    class_means: list[tuple[str, str, float | None]] = []
    statistics = OrderStatistics()
    for name, (part, counts) in zip(sorted(results), _each_class(results, _first_pass), strict=True):
        total += int(counts.sum())
        nulls += counts
        mean = statistics.merge(part)
        if mean is not None:
            class_means.append(("subset_distance_mean", name, mean))
    nulls[0] = 0

    def again(wanted: np.ndarray) -> Iterator[np.ndarray]:
        return _each_class(results, lambda embedding: in_bins(_defined_distances(embedding)[0], wanted))

    rows = statistics.summary("subset_distance", SCOPE_ALL, again)
    by_status = {status: int(n) for status, n in zip(em.STATUSES, nulls.tolist(), strict=True) if n}
    return DistanceStatistics(magnitudes_table(build.FAMILY, [*rows, *class_means]), by_status, total)


CLASS_SCHEMA = pl.Schema(
    {
        "class": pl.String(),
        "n_images": pl.Int64(),
        "n_candidates": pl.Int64(),
        "n_selected": pl.Int64(),
        "n_too_small": pl.Int64(),
        "n_capped": pl.Int64(),
        "n_class_too_few_subsets": pl.Int64(),
        "has_meta_graph": pl.Boolean(),
    }
)
IMAGE_SCHEMA = pl.Schema({"image": pl.Int32(), "image_id": pl.String()})
ATTRIBUTE_SCHEMA = pl.Schema({"image": pl.Int32(), "class": pl.Int32(), "attribute": pl.Int32()})
CLASS_NAME_SCHEMA = pl.Schema({"class": pl.Int32(), "name": pl.Int32()})
VOCABULARY_SCHEMA = pl.Schema({"code": pl.Int32(), "value": pl.String()})
