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
    # The product is block-diagonal by class: classes are taken in groups of about OVERLAP_CHUNK
    # incidence entries, so the incidence matrix and its product never exist for all classes at once.
    selected = memberships.pairs.join(
        columns.select(pl.col("code").alias("subset"), "class_code", "col"), on="subset", how="inner"
    )
    per_class = selected.group_by("class_code").len().sort("class_code")
    group = (per_class["len"].cum_sum() - per_class["len"]) // OVERLAP_CHUNK
    parts = []
    for chunk in per_class.with_columns(group.alias("group")).partition_by("group"):
        incidence = selected.join(chunk.select("class_code"), on="class_code", how="semi")
        parts.append(_chunk_edges(incidence, columns, threshold))
    del selected
    return pl.concat(parts).sort("class", "subset_a", "subset_b")


OVERLAP_CHUNK = 4_000_000


def _chunk_edges(incidence: pl.DataFrame, columns: pl.DataFrame, threshold: float) -> pl.DataFrame:
    rows = incidence.select("class_code", "image").unique().with_row_index("row")
    incidence = incidence.join(rows, on=["class_code", "image"])
    # int32 throughout (counts and indices fit): half the memory of scipy's default int64.
    matrix = sp.csc_array(
        (
            np.ones(incidence.height, dtype=np.int32),
            (incidence["row"].cast(pl.Int32).to_numpy(), incidence["col"].cast(pl.Int32).to_numpy()),
        ),
        shape=(rows.height, columns.height),
    )
    del incidence, rows
    shared = sp.triu(matrix.T @ matrix, k=1).tocoo()
    sizes = columns["n_images"].to_numpy()
    i, j, n = shared.row, shared.col, shared.data
    overlap = n / np.minimum(sizes[i], sizes[j])
    keep = (overlap >= threshold) & (n > 0)
    names = columns["subset"].to_numpy()
    classes = columns["class"].to_numpy()
    a, b = names[i[keep]], names[j[keep]]
    first = np.where(a < b, a, b)
    second = np.where(a < b, b, a)
    return pl.DataFrame(
        {
            "class": classes[i[keep]],
            "subset_a": first,
            "subset_b": second,
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
