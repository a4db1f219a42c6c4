"""Meta-graphs: per class, subsets as nodes and their overlap coefficient as edge weights.

overlap(X, Y) = |X ∩ Y| / min(|X|, |Y|) (paper Eq. 1) for every pair of subsets of a class comes
from one sparse product: with M the 0/1 incidence matrix whose rows are (class, image) pairs and
whose columns are subsets, (MᵀM)[i, j] = |X_i ∩ X_j|. Rows are keyed by class as well as image,
so MᵀM is block-diagonal by class and no cross-class pair is ever computed. This replaces the
released scripts' Python set intersections over all pairs (see ``bench/bench_metashift.py``).

Communities: Louvain (the paper, seeded: networkx's algorithm and communities, compiled in
:mod:`shiftbench.metashift.louvain`) or greedy modularity (what the released scripts ran,
``networkx.greedy_modularity_communities(G)``, which ignores edge weights).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import networkx as nx
import numpy as np
import polars as pl
import scipy.sparse as sp

from shiftbench.errors import InputError
from shiftbench.metashift.subsets import Memberships

COMMUNITY_METHODS = ("louvain", "greedy_modularity")
EDGE_SCHEMA = {
    "class": pl.String,
    "subset_a": pl.String,
    "subset_b": pl.String,
    "n_shared": pl.Int64,
    "overlap": pl.Float64,
}


# An edge threshold cuts one of two graphs, each with its own default (declared here only):
# - a class's meta-graph of subsets: the paper's 0.1 (Section 3.1), for collections, and for tasks that measure d on it
#   (community_embedding: member_mean, the paper's merge: the shipped member_mean tasks and `shiftbench generate`);
# - the graph of a task's communities (community_embedding: community_graph, the task default): the released task
#   scripts' 0.2.
SUBSET_GRAPH_EDGE_THRESHOLD = 0.1
COMMUNITY_GRAPH_EDGE_THRESHOLD = 0.2


def check_edge_threshold(value: float, parameter: str = "edge_threshold") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise InputError(f"must be a number in [0, 1] (an overlap coefficient), got {value!r}", parameter=parameter)
    return float(value)


def node_order(subsets: pl.DataFrame) -> pl.DataFrame:
    """Nodes of each class, largest subset first (the released scripts' ``Counter.most_common`` order)."""
    return subsets.sort(["class", "n_images", "subset"], descending=[False, True, False]).with_columns(
        pl.int_range(pl.len()).over("class").alias("node")
    )


def overlap_edges(memberships: Memberships, nodes: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """Edges (overlap >= threshold and > 0) between subsets of the same class.

    ``nodes``: (class, subset, n_images, code, class_code) of the subsets to connect, ``code`` being the
    memberships' subset code. Returns ``class, subset_a, subset_b, n_shared, overlap`` with
    subset_a < subset_b. The incidence matrix is built from integer codes only.
    """
    columns = nodes.select("class", "subset", "n_images", "code", "class_code").with_row_index("col")
    if columns.height < 2:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    # The memberships are runs of images, one per subset in code order: a selected subset's images are one slice.
    sizes = memberships.sizes()
    code = columns["code"].to_numpy()
    first, length = (np.cumsum(sizes) - sizes)[code], sizes[code]
    image = memberships.pairs["image"].to_numpy()
    # The product is block-diagonal by class: classes (consecutive columns, nodes being in class order) are taken
    # in groups of about OVERLAP_CHUNK incidence entries, so the incidence matrix and its product never exist for
    # all classes at once.
    class_code = columns["class_code"].to_numpy()
    class_start = np.flatnonzero(np.r_[True, class_code[1:] != class_code[:-1]])
    entries_before = np.r_[0, np.cumsum(length)][class_start]
    group = entries_before // OVERLAP_CHUNK
    bounds = np.r_[class_start[np.r_[True, group[1:] != group[:-1]]], len(code)]
    parts = [
        _chunk_edges(image, first, length, class_code, columns, lo, hi, threshold)
        for lo, hi in itertools.pairwise(bounds.tolist())
    ]
    return pl.concat(parts).sort("class", "subset_a", "subset_b")


OVERLAP_CHUNK = 4_000_000
KEY_BITS = 64  # the bits of one sort key (lowered by a test, to run the other path)


def _chunk_edges(
    image: np.ndarray,
    first: np.ndarray,
    length: np.ndarray,
    class_code: np.ndarray,
    columns: pl.DataFrame,
    lo: int,
    hi: int,
    threshold: float,
) -> pl.DataFrame:
    """The edges among columns ``lo..hi`` (whole classes): the incidence matrix as CSR made by one sort of one
    64-bit key per entry, (class, image, column), whose runs of equal (class, image) are the matrix's rows."""
    lengths = length[lo:hi]
    offsets = np.cumsum(lengths) - lengths
    entries = np.repeat(first[lo:hi] - offsets, lengths) + np.arange(int(lengths.sum()))
    column = np.repeat(np.arange(hi - lo, dtype=np.uint64), lengths)
    local_class = np.repeat(np.cumsum(np.r_[0, class_code[lo + 1 : hi] != class_code[lo : hi - 1]]), lengths)
    column_bits = max(hi - lo - 1, 1).bit_length()
    image_bits = max(int(image.max(initial=0)), 1).bit_length()
    images = image[entries].astype(np.uint64)
    if int(local_class[-1]).bit_length() + image_bits + column_bits <= KEY_BITS:
        packed = (local_class.astype(np.uint64) << np.uint64(image_bits + column_bits)) | (
            images << np.uint64(column_bits) | column
        )
        packed = pl.Series(packed).sort().to_numpy()  # polars' sort: parallel, faster than numpy's here
        row_key, column = packed >> np.uint64(column_bits), packed & np.uint64((1 << column_bits) - 1)
    else:  # never for real inputs: the same order by a three-key sort
        order = np.lexsort((column, images, local_class))
        row_key = local_class[order].astype(np.uint64) << np.uint64(image_bits) | images[order]
        column = column[order]
    new_row = np.r_[True, row_key[1:] != row_key[:-1]]
    indptr = np.r_[np.flatnonzero(new_row), len(row_key)].astype(np.int32)
    # int32 throughout (counts and indices fit): half the memory of scipy's default int64.
    matrix = sp.csr_array(
        (np.ones(len(row_key), dtype=np.int32), column.astype(np.int32), indptr), shape=(len(indptr) - 1, hi - lo)
    )
    del row_key, column, new_row, indptr
    shared = sp.triu(matrix.T @ matrix, k=1).tocoo()
    sizes = length[lo:hi]
    i, j, n = shared.row, shared.col, shared.data
    overlap = n / np.minimum(sizes[i], sizes[j])
    keep = (overlap >= threshold) & (n > 0)
    chunk = columns.slice(lo, hi - lo)
    names = chunk["subset"].to_numpy()
    classes = chunk["class"].to_numpy()
    a, b = names[i[keep]], names[j[keep]]
    lower = np.where(a < b, a, b)
    upper = np.where(a < b, b, a)
    return pl.DataFrame(
        {
            "class": classes[i[keep]],
            "subset_a": lower,
            "subset_b": upper,
            "n_shared": n[keep].astype(np.int64),
            "overlap": overlap[keep].astype(np.float64),
        },
        schema=EDGE_SCHEMA,
    )


@dataclass(frozen=True)
class ClassGraph:
    """One class's meta-graph: nodes in :func:`node_order`, weights as a symmetric sparse matrix."""

    class_name: str
    nodes: list[str]
    sizes: np.ndarray
    weights: sp.csr_array

    def to_networkx(self) -> nx.Graph:
        graph = nx.Graph()
        graph.add_nodes_from(self.nodes)
        coo = sp.triu(self.weights, k=1).tocoo()
        graph.add_weighted_edges_from(
            (self.nodes[i], self.nodes[j], float(w)) for i, j, w in zip(coo.row, coo.col, coo.data, strict=True)
        )
        return graph


def class_graphs(nodes: pl.DataFrame, edges: pl.DataFrame) -> dict[str, ClassGraph]:
    """Assemble per-class weight matrices from the node order and the edge table."""
    graphs: dict[str, ClassGraph] = {}
    edges_by_class = {key[0]: frame for key, frame in edges.partition_by("class", as_dict=True).items()}
    for (class_name,), frame in sorted(nodes.partition_by("class", as_dict=True).items()):
        frame = frame.sort("node")
        names = frame["subset"].to_list()
        index = {name: k for k, name in enumerate(names)}
        class_edges = edges_by_class.get(class_name)
        n = len(names)
        if class_edges is None or class_edges.height == 0:
            weights = sp.csr_array((n, n), dtype=np.float64)
        else:
            a = np.array([index[s] for s in class_edges["subset_a"].to_list()], dtype=np.int64)
            b = np.array([index[s] for s in class_edges["subset_b"].to_list()], dtype=np.int64)
            w = class_edges["overlap"].to_numpy()
            weights = sp.csr_array(
                (np.concatenate([w, w]), (np.concatenate([a, b]), np.concatenate([b, a]))), shape=(n, n)
            )
        graphs[str(class_name)] = ClassGraph(str(class_name), names, frame["n_images"].to_numpy(), weights)
    return graphs


def detect_communities(graph: ClassGraph, method: str, seed: int) -> list[list[str]]:
    """Communities as sorted member lists, largest first (ties: first member name)."""
    if method not in COMMUNITY_METHODS:
        raise InputError(f"must be one of {', '.join(COMMUNITY_METHODS)}, got {method!r}", parameter="community_method")
    if method == "louvain":  # networkx's communities, compiled (imported here: numba costs 0.2 s to import)
        from shiftbench.metashift import louvain

        coo = sp.triu(graph.weights, k=1).tocoo()  # the edges in the order to_networkx adds them
        labels = louvain.communities(
            len(graph.nodes),
            coo.row.astype(np.int64),
            coo.col.astype(np.int64),
            coo.data.astype(np.float64),
            seed,
        )
        groups: dict[int, list[str]] = {}
        for node, label in zip(graph.nodes, labels.tolist(), strict=True):
            groups.setdefault(label, []).append(node)
        found: list[list[str]] | list[set[str]] = list(groups.values())
    else:
        found = nx.community.greedy_modularity_communities(graph.to_networkx())
    communities = [sorted(c) for c in found]
    return sorted(communities, key=lambda c: (-len(c), c[0]))


def modularity(graph: ClassGraph, communities: list[list[str]]) -> float | None:
    """Newman's weighted modularity (resolution 1), as ``networkx.community.modularity`` defines it.

    Written here rather than called from networkx: networkx adds the communities' terms in the order
    of Python sets, which changes with the process's string hashing, and rounding that sum to 12
    digits still flipped its last digit in some processes (and with it the version id). Here every sum
    is exactly rounded (``math.fsum``), so the value does not depend on any order; it is rounded to 12
    digits as before, so the published values stay those networkx gave.
    """
    coo = sp.triu(graph.weights, k=1).tocoo()
    if coo.nnz == 0:
        return None
    index = {name: k for k, name in enumerate(graph.nodes)}
    label = np.full(len(graph.nodes), -1, dtype=np.int64)
    for number, members in enumerate(communities):
        label[[index[name] for name in members]] = number
    ends = np.concatenate([coo.row, coo.col])
    incident = np.concatenate([coo.data, coo.data])
    by_node = np.argsort(ends, kind="stable")
    bounds = np.searchsorted(ends[by_node], np.arange(len(graph.nodes) + 1))
    ordered = incident[by_node]
    degree = np.array([math.fsum(ordered[bounds[k] : bounds[k + 1]].tolist()) for k in range(len(graph.nodes))])
    degree_sum = math.fsum(degree.tolist())
    m = degree_sum / 2
    internal = label[coo.row] == label[coo.col]
    terms = []
    for number in range(len(communities)):
        inside = math.fsum(coo.data[internal & (label[coo.row] == number)].tolist())
        total = math.fsum(degree[label == number].tolist())
        terms.append(inside / m - total * total / degree_sum**2)
    return round(math.fsum(terms), 12) + 0.0
