"""One class's part of a collection, from the scene index alone: the unit a build fans out over.

For a class: its candidate subsets and their sizes (:func:`candidates`), which are selected (size, the
class's cap on contexts, the class's count of large subsets), the overlaps between its selected subsets
(its meta-graph's edges), its communities and its spectral embedding. Nothing here looks at another class,
so classes are built in any grouping (threads, buckets of processes, Dagster steps) with the same result;
and nothing is stored per pair of subsets: distances are a view over the embeddings
(``data_contracts/metashift/metashift_distances.sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import scipy.sparse as sp

from shiftbench.metashift import embedding as em
from shiftbench.metashift import kernels
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.index import SceneIndex
from shiftbench.metashift.subsets import CONTEXT_KINDS

if TYPE_CHECKING:  # a class's work (in worker processes too) needs the values, not the spec model
    from shiftbench.metashift.specs import CollectionSpec

SELECTIONS = ("selected", "too_small", "capped", "class_too_few_subsets")
DENSE_COOCCURRENCE_MAX = 8192  # selected subsets of one class counted in a dense k x k matrix (256 MiB at most)


@dataclass(frozen=True)
class ClassSettings:
    """What a class's work depends on: the collection spec's parameters of these names (:meth:`of`), no more (a
    unit of work gets these, not the spec with its scope's class list)."""

    min_subset_size: int
    min_subsets_per_class: int
    max_contexts_per_class: int | None
    edge_threshold: float
    embedding: str
    embedding_dim: int
    community_method: str
    seed: int

    @classmethod
    def of(cls, spec: CollectionSpec) -> ClassSettings:
        return cls(**{f.name: getattr(spec, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Candidates:
    """A class's large candidate subsets (``min_subset_size`` images or more) in selection order (largest first,
    ties by name), and how many smaller ones it has (counted, never named)."""

    names: list[str]
    contexts: list[str]
    kinds: np.ndarray  # index into CONTEXT_KINDS
    codes: np.ndarray  # context code in the index's vocabulary
    sizes: np.ndarray
    n_small: int
    largest: int  # the largest candidate's size, small or not


@dataclass(frozen=True)
class Listed:
    """A class's rows of ``metashift_subsets`` as plain columns: one table is made of every class's at once
    (:func:`listed_table`; a polars frame per class cost more than counting the class, 1,700 GQA classes)."""

    subsets: list[str]
    contexts: list[str]
    kinds: np.ndarray  # int8 positions in CONTEXT_KINDS
    codes: np.ndarray  # int64 context codes
    sizes: np.ndarray  # int64 images
    selection: list[str]


@dataclass(frozen=True)
class ClassOutcome:
    """Everything a collection keeps of one class."""

    class_name: str
    class_code: int
    n_images: int
    counts: dict[str, int]  # candidates by selection status
    listed: Listed  # subsets listed in metashift_subsets (selected, or large in a dropped class)
    result: ClassResult | None  # None when the class has too few large subsets
    selected_codes: dict[str, np.ndarray]  # per context kind, the codes of its selected contexts
    largest: int  # its largest candidate's size


@dataclass(frozen=True)
class ClassResult:
    graph: mg.ClassGraph
    communities: list[list[str]]
    embedding: em.Embedding
    # the edges as node numbers (in graph.nodes) and values: made into strings once for all classes (edge_table)
    edge_rows: np.ndarray
    edge_columns: np.ndarray
    edge_shared: np.ndarray
    edge_overlap: np.ndarray
    modularity: float | None  # of the communities (metashift_graphs)

    @property
    def edges(self) -> pl.DataFrame:
        return edge_table([self])


def edge_table(results: Sequence[ClassResult]) -> pl.DataFrame:
    """``metashift_edges`` of some classes: ``subset_a`` < ``subset_b``, sorted by class then subsets; the strings
    are made here, for all of them at once (a data frame per class cost about a millisecond each)."""
    if not results:
        return pl.DataFrame(schema=mg.EDGE_SCHEMA)
    names = pl.Series([n for r in results for n in r.graph.nodes], dtype=pl.String)
    first = np.cumsum([0] + [len(r.graph.nodes) for r in results])[:-1]
    counts = np.array([len(r.edge_rows) for r in results])
    classes = pl.Series([r.graph.class_name for r in results], dtype=pl.String)
    offset = np.repeat(first, counts)
    a, b = pl.col("a"), pl.col("b")
    frame = pl.DataFrame(
        {
            "class": classes.gather(np.repeat(np.arange(len(results)), counts)),
            "a": names.gather(offset + np.concatenate([r.edge_rows for r in results])),
            "b": names.gather(offset + np.concatenate([r.edge_columns for r in results])),
            "n_shared": np.concatenate([r.edge_shared for r in results]).astype(np.int64),
            "overlap": np.concatenate([r.edge_overlap for r in results]).astype(np.float64),
        }
    )
    return (
        frame.select(
            "class",
            pl.when(a < b).then(a).otherwise(b).alias("subset_a"),
            pl.when(a < b).then(b).otherwise(a).alias("subset_b"),
            "n_shared",
            "overlap",
        )
        .cast(mg.EDGE_SCHEMA)  # type: ignore[arg-type]
        .sort("class", "subset_a", "subset_b")
    )


def candidates(index: SceneIndex, code: int, counts: np.ndarray, min_subset_size: int) -> Candidates:
    """A class's candidate subsets with their sizes: the images of the class that show the context.

    Only the large ones are named. A context name can exist in two kinds (the object "grass" and the place
    "grass"): the first kind (object, attribute, general) keeps ``cat(grass)``, the other is
    ``cat(general:grass)``, whatever their sizes.
    """
    images = index.images_of(code)
    found: list[tuple[int, np.ndarray, np.ndarray]] = []
    if "object" in index.kinds:
        excluded = index.excluded[index.excluded_offsets[code] : index.excluded_offsets[code + 1]]
        codes, sizes = kernels.count_contexts(
            images, index.image_object_offsets, index.image_objects, excluded.astype(np.int64), counts
        )
        found.append((0, codes, sizes))
    if "attribute" in index.kinds:
        pairs = index.class_attributes[index.class_attribute_offsets[code] : index.class_attribute_offsets[code + 1]]
        codes, sizes = kernels.count_attributes(pairs.astype(np.int64), counts)
        found.append((1, codes, sizes))
    if "general" in index.kinds:
        codes, sizes = kernels.count_contexts(
            images, index.image_general_offsets, index.image_general, np.zeros(0, dtype=np.int64), counts
        )
        found.append((2, codes, sizes))
    class_name = index.class_name(code)
    names: list[str] = []
    contexts: list[str] = []
    kinds, codes_kept, sizes_kept = [], [], []
    n_small = 0
    earlier = np.zeros(0, dtype=np.int64)
    for kind, codes, sizes in found:
        large = sizes >= min_subset_size
        n_small += int((~large).sum())
        clash = np.isin(codes[large], earlier)
        earlier = np.union1d(earlier, codes)
        strings = [index.names[c] for c in codes[large].tolist()]
        prefix = f"{CONTEXT_KINDS[kind]}:"
        names += [f"{class_name}({prefix if c else ''}{s})" for s, c in zip(strings, clash.tolist(), strict=True)]
        contexts += strings
        kinds.append(np.full(len(strings), kind, dtype=np.int8))
        codes_kept.append(codes[large])
        sizes_kept.append(sizes[large])
    all_sizes = np.concatenate(sizes_kept) if sizes_kept else np.zeros(0, np.int64)
    order = sorted(range(len(names)), key=lambda k: (-int(all_sizes[k]), names[k]))
    return Candidates(
        [names[k] for k in order],
        [contexts[k] for k in order],
        (np.concatenate(kinds) if kinds else np.zeros(0, np.int8))[order],
        (np.concatenate(codes_kept) if codes_kept else np.zeros(0, np.int64))[order],
        all_sizes[order],
        n_small,
        max((int(sizes.max()) for _, _, sizes in found if len(sizes)), default=0),
    )


def select(found: Candidates, settings: ClassSettings) -> tuple[list[str], bool]:
    """Each large candidate's status, and whether the class gets a meta-graph.

    ``capped``: large enough, but beyond the class's ``max_contexts_per_class`` largest (ties by name). The class
    is kept when it has at least ``min_subsets_per_class`` large subsets within the cap (the released code drops
    classes with 5 or fewer); otherwise its large subsets are ``class_too_few_subsets``. (Candidates with fewer
    than ``min_subset_size`` images are ``too_small``, counted in :attr:`Candidates.n_small`.)
    """
    cap = settings.max_contexts_per_class
    kept = len(found.names) if cap is None else min(cap, len(found.names))
    enough = kept >= settings.min_subsets_per_class
    status = ["selected" if enough else "class_too_few_subsets"] * kept + ["capped"] * (len(found.names) - kept)
    return status, enough


def build_class(index: SceneIndex, code: int, settings: ClassSettings, counts: np.ndarray) -> ClassOutcome:
    """Candidates, selection, meta-graph, communities and embedding of one class (``counts``: a zeroed scratch
    array as long as the vocabulary, one per thread)."""
    found = candidates(index, code, counts, settings.min_subset_size)
    status, enough = select(found, settings)
    class_name = index.class_name(code)
    listed_rows = [k for k, s in enumerate(status) if s in ("selected", "class_too_few_subsets")]
    listed = Listed(
        [found.names[k] for k in listed_rows],
        [found.contexts[k] for k in listed_rows],
        found.kinds[listed_rows],
        found.codes[listed_rows],
        found.sizes[listed_rows],
        [status[k] for k in listed_rows],
    )
    tally = dict.fromkeys(SELECTIONS, 0)
    tally["too_small"] = found.n_small
    for s in status:
        tally[s] += 1
    chosen = [k for k, s in enumerate(status) if s == "selected"]
    selected_codes = {
        kind: found.codes[[k for k in chosen if found.kinds[k] == number]].astype(np.int64)
        for number, kind in enumerate(CONTEXT_KINDS)
    }
    result = _meta_graph(index, code, found, chosen, settings) if enough else None
    n_images = len(index.images_of(code))
    return ClassOutcome(class_name, code, n_images, tally, listed, result, selected_codes, found.largest)


def _meta_graph(
    index: SceneIndex, code: int, found: Candidates, chosen: Sequence[int], settings: ClassSettings
) -> ClassResult:
    """Edges (overlap coefficient >= threshold), communities and embedding of the class's selected subsets.

    Nodes are in selection order, which is the released scripts' (``Counter.most_common``: largest first)."""
    k = len(chosen)
    size = len(index.vocabulary)
    local = {kind: np.full(size, -1, dtype=np.int64) for kind in CONTEXT_KINDS}
    for number, position in enumerate(chosen):
        local[CONTEXT_KINDS[int(found.kinds[position])]][int(found.codes[position])] = number
    sizes = found.sizes[list(chosen)].astype(np.int64)
    names = [found.names[p] for p in chosen]
    start, end = index.class_attribute_offsets[code], index.class_attribute_offsets[code + 1]
    arguments = (
        index.images_of(code),
        index.image_object_offsets,
        index.image_objects,
        local["object"],
        index.image_general_offsets,
        index.image_general,
        local["general"],
        index.class_attribute_images[start:end],
        index.class_attributes[start:end],
        local["attribute"],
    )
    if k <= DENSE_COOCCURRENCE_MAX:
        dense = kernels.cooccurrences(*arguments, k)
        rows, columns = np.nonzero(dense)
        shared = dense[rows, columns].astype(np.int64)
        del dense
    else:  # beyond a dense matrix's reach: the same counts as a sparse product
        matrix = _sparse_cooccurrences(*arguments, k)
        rows, columns = matrix.row.astype(np.int64), matrix.col.astype(np.int64)
        shared = matrix.data.astype(np.int64)
    overlap = shared / np.minimum(sizes[rows], sizes[columns])
    keep = (overlap >= settings.edge_threshold) & (shared > 0)
    rows, columns, shared, overlap = rows[keep], columns[keep], shared[keep], overlap[keep]
    weights = sp.csr_array(
        (np.concatenate([overlap, overlap]), (np.concatenate([rows, columns]), np.concatenate([columns, rows]))),
        shape=(k, k),
    )
    graph = mg.ClassGraph(index.class_name(code), names, sizes, weights)
    communities = mg.detect_communities(graph, settings.community_method, settings.seed)
    embedding = em.embed(graph.weights, settings.embedding_dim, settings.embedding)
    modularity = mg.modularity(graph, communities)  # here, on the class's thread, not when the tables are made
    return ClassResult(graph, communities, embedding, rows, columns, shared, overlap, modularity)


def _sparse_cooccurrences(
    images: np.ndarray,
    object_offsets: np.ndarray,
    objects: np.ndarray,
    object_local: np.ndarray,
    general_offsets: np.ndarray,
    general: np.ndarray,
    general_local: np.ndarray,
    attribute_images: np.ndarray,
    attributes: np.ndarray,
    attribute_local: np.ndarray,
    k: int,
) -> sp.coo_array:
    """The upper triangle of MᵀM for M the class's (image x selected subset) incidence, as a sparse product."""
    rows, columns = [], []
    for offsets, values, lookup in ((object_offsets, objects, object_local), (general_offsets, general, general_local)):
        lengths = offsets[images + 1] - offsets[images]
        starts = np.repeat(offsets[images] - (np.cumsum(lengths) - lengths), lengths)
        codes = values[starts + np.arange(int(lengths.sum()))]
        local = lookup[codes]
        image_row = np.repeat(np.arange(len(images)), lengths)
        rows.append(image_row[local >= 0])
        columns.append(local[local >= 0])
    position = np.searchsorted(images, attribute_images)
    local = attribute_local[attributes]
    rows.append(position[local >= 0])
    columns.append(local[local >= 0])
    matrix = sp.csr_array(
        (np.ones(sum(len(r) for r in rows), dtype=np.int32), (np.concatenate(rows), np.concatenate(columns))),
        shape=(len(images), k),
    )
    return sp.triu(matrix.T @ matrix, k=1).tocoo()


def listed_table(index: SceneIndex, outcomes: Sequence[ClassOutcome]) -> pl.DataFrame:
    """The listed subsets of every class, in the order of ``outcomes`` (columns of :data:`LISTED_SCHEMA`)."""
    parts = [o.listed for o in outcomes]
    lengths = np.array([len(p.subsets) for p in parts], dtype=np.int64)
    kinds = np.concatenate([p.kinds for p in parts]) if parts else np.zeros(0, np.int8)
    codes = np.concatenate([p.codes for p in parts]) if parts else np.zeros(0, np.int64)
    selection = [s for p in parts for s in p.selection]
    general = CONTEXT_KINDS.index("general")
    return pl.DataFrame(
        {
            "subset": [s for p in parts for s in p.subsets],
            "class": pl.Series([o.class_name for o in outcomes], dtype=pl.String).gather(
                np.repeat(np.arange(len(parts)), lengths)
            ),
            "context": [c for p in parts for c in p.contexts],
            "context_kind": pl.Series(CONTEXT_KINDS, dtype=pl.String).gather(kinds.astype(np.int64)),
            "context_group": [
                index.general_groups.get(int(c)) if k == general else None
                for k, c in zip(kinds.tolist(), codes.tolist(), strict=True)
            ],
            "n_images": (np.concatenate([p.sizes for p in parts]) if parts else np.zeros(0)).astype(np.int64),
            "selected": [s == "selected" for s in selection],
            "selection": selection,
            "class_code": np.repeat(np.array([o.class_code for o in outcomes], dtype=np.int32), lengths),
            "context_code": codes.astype(np.int32),
        },
        schema=LISTED_SCHEMA,
    )


LISTED_SCHEMA = pl.Schema(
    {
        "subset": pl.String(),
        "class": pl.String(),
        "context": pl.String(),
        "context_kind": pl.String(),
        "context_group": pl.String(),
        "n_images": pl.Int64(),
        "selected": pl.Boolean(),
        "selection": pl.String(),
        "class_code": pl.Int32(),
        "context_code": pl.Int32(),
    }
)
