"""Louvain communities exactly as ``networkx.community.louvain_communities`` finds them, compiled with numba.

At GQA scale Louvain on 1,600 meta-graphs took 6.5 s of networkx Python (the largest stage of a collection
after the embeddings); compiled it takes a fraction of a second. No well-kept library gives networkx's
communities: igraph, leidenalg and python-louvain visit nodes in other orders and with other random draws, so
their communities (and the published version ids) would differ. This is therefore a port of networkx 3's
algorithm, written out here with the same operations in the same order:

- the graph is a networkx ``Graph`` as :meth:`ClassGraph.to_networkx` builds it: nodes in node order, edges in
  the order given, each node's neighbours in the order its edges were added (adjacency lists below);
- every level shuffles its nodes with the same ``random.Random(seed)`` (the shuffle runs in Python, on the
  same object, so the draws are networkx's);
- node moves, modularity gains (``remove_cost``, ``gain``, the strict ``>``), the weights of the neighbouring
  communities in the order they are first met, the graph of communities of the next level and the degrees are
  computed with the same float operations in the same order (powers such as ``m**2`` are taken in Python,
  whose ``pow`` differs from ``m * m`` in the last bit for about one value in a thousand).

One difference is by design: networkx stops when a level gains less than ``threshold`` modularity, and it sums
each community's modularity terms in the iteration order of a Python ``set`` of nodes (at the first level a set
of subset names, whose order changes with the process's string hashing). Here the terms are summed in node
order. The two can only disagree when a level's gain is within rounding of ``threshold`` (1e-7), where
networkx's own answer already depends on ``PYTHONHASHSEED``. The tests compare both on random and real graphs.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from numba import types
from numba.typed import Dict

from shiftbench.metashift.compiled import njit_cached

THRESHOLD = 1e-7  # networkx's default minimum modularity gain of a level


def _jit(function: Any) -> Any:
    """Compiled and cached outside the package (:mod:`shiftbench.metashift.compiled`)."""
    return njit_cached(function)


def _adjacency_py(n: int, first: np.ndarray, second: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, ...]:
    """Adjacency lists of a networkx ``Graph`` built by adding these edges in this order (each distinct pair once,
    weights of repeated pairs added, neighbours in the order their edge was first added; a self-loop once)."""
    count = np.zeros(n, dtype=np.int64)
    slot_of = Dict.empty(key_type=types.int64, value_type=types.int64)  # (low, high) as one integer -> edge slot
    ends = np.empty((len(first), 2), dtype=np.int64)
    total = np.zeros(len(first), dtype=np.float64)
    seen = np.zeros(len(first), dtype=np.bool_)
    edges = 0
    for k in range(len(first)):
        u, v = first[k], second[k]
        low, high = (u, v) if u <= v else (v, u)
        key = low * n + high
        if key in slot_of:
            slot = slot_of[key]
        else:
            slot = edges
            slot_of[key] = slot
            ends[slot, 0], ends[slot, 1] = u, v
            edges += 1
            count[u] += 1
            if u != v:
                count[v] += 1
        if seen[slot]:
            total[slot] = weight[k] + total[slot]  # networkx: wt + temp
        else:
            total[slot] = weight[k]
            seen[slot] = True
    pointer = np.zeros(n + 1, dtype=np.int64)
    for u in range(n):
        pointer[u + 1] = pointer[u] + count[u]
    fill = pointer[:-1].copy()
    neighbour = np.empty(pointer[n], dtype=np.int64)
    edge = np.empty(pointer[n], dtype=np.int64)
    for slot in range(edges):  # in the order edges were first added: each list keeps insertion order
        u, v = ends[slot, 0], ends[slot, 1]
        neighbour[fill[u]], edge[fill[u]] = v, slot
        fill[u] += 1
        if u != v:
            neighbour[fill[v]], edge[fill[v]] = u, slot
            fill[v] += 1
    return pointer, neighbour, total[:edges][edge] if edges else np.zeros(0)


def _edges_in_order_py(pointer: np.ndarray, neighbour: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, ...]:
    """``G.edges(data=True)`` of a graph whose nodes are 0..n-1 in node order: each edge once, from its first
    node in node order, in that node's neighbour order."""
    n = len(pointer) - 1
    first = np.empty(len(neighbour), dtype=np.int64)
    second = np.empty(len(neighbour), dtype=np.int64)
    value = np.empty(len(neighbour), dtype=np.float64)
    k = 0
    for u in range(n):
        for position in range(pointer[u], pointer[u + 1]):
            v = neighbour[position]
            if v >= u:
                first[k], second[k], value[k] = u, v, weight[position]
                k += 1
    return first[:k], second[:k], value[:k]


def _degrees_py(pointer: np.ndarray, neighbour: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``G.degree(weight="weight")``: neighbour weights summed in neighbour order, a self-loop counted twice."""
    n = len(pointer) - 1
    degree = np.zeros(n, dtype=np.float64)
    for u in range(n):
        total = 0.0
        loop = 0.0
        for position in range(pointer[u], pointer[u + 1]):
            total += weight[position]
            if neighbour[position] == u:
                loop = weight[position]
        degree[u] = total + loop
    return degree


def _sum_py(values: np.ndarray) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _one_level_py(
    pointer: np.ndarray,
    neighbour: np.ndarray,
    weight: np.ndarray,
    degree: np.ndarray,
    m: float,
    twice_m_squared: float,
    order: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """networkx's ``_one_level`` (undirected, resolution 1): the community of each node, and whether one moved."""
    n = len(pointer) - 1
    community = np.arange(n)
    total = degree.copy()  # Stot
    met = np.full(n, -1, dtype=np.int64)  # the node whose neighbourhood last met each community
    found = np.empty(n, dtype=np.int64)  # communities in the order first met (weights2com's order)
    towards = np.zeros(n, dtype=np.float64)  # weights2com
    improvement = False
    moves = 1
    while moves > 0:
        moves = 0
        for u in order:
            size = 0
            for position in range(pointer[u], pointer[u + 1]):
                v = neighbour[position]
                if v == u:
                    continue
                c = community[v]
                if met[c] != u:
                    met[c] = u
                    towards[c] = 0.0
                    found[size] = c
                    size += 1
                towards[c] += weight[position]
            best = community[u]
            if met[best] != u:  # weights2com[best_com] inserts it, last, with weight 0
                met[best] = u
                towards[best] = 0.0
                found[size] = best
                size += 1
            d = degree[u]
            total[best] -= d
            remove_cost = -towards[best] / m + (total[best] * d) / twice_m_squared
            best_gain = 0.0
            for k in range(size):
                c = found[k]
                gain = remove_cost + towards[c] / m - (total[c] * d) / twice_m_squared
                if gain > best_gain:
                    best_gain = gain
                    best = c
            total[best] += d
            if best != community[u]:
                community[u] = best
                improvement = True
                moves += 1
            met[community[u]] = -1  # each node starts its neighbourhood afresh (u is never met twice)
            for k in range(size):
                met[found[k]] = -1
    return community, improvement


def _internal_weights_py(
    pointer: np.ndarray, neighbour: np.ndarray, weight: np.ndarray, label: np.ndarray, k: int
) -> np.ndarray:
    """Each community's weight of edges inside it (each edge once, a self-loop once), nodes in node order."""
    inside = np.zeros(k, dtype=np.float64)
    n = len(pointer) - 1
    for u in range(n):
        for position in range(pointer[u], pointer[u + 1]):
            v = neighbour[position]
            if v >= u and label[v] == label[u]:
                inside[label[u]] += weight[position]
    return inside


def _compact(community: np.ndarray) -> tuple[np.ndarray, int]:
    """Community ids renumbered 0..k-1 in id order (networkx drops empty communities, keeping the order)."""
    used = np.unique(community)
    renumber = np.full(len(community), -1, dtype=np.int64)
    renumber[used] = np.arange(len(used))
    return renumber[community], len(used)


def _contributions_py(
    degree: np.ndarray, inside: np.ndarray, label: np.ndarray, k: int, m: float, norm: float
) -> float:
    """The sum of the communities' modularity terms ``L_c / m - S_c * S_c * norm`` in community order, each
    community's degree sum S_c taken in node order."""
    strength = np.zeros(k, dtype=np.float64)
    for u in range(len(label)):
        strength[label[u]] += degree[u]
    total = 0.0
    for c in range(k):
        total += inside[c] / m - strength[c] * strength[c] * norm
    return total


def _modularity(degree: np.ndarray, inside: np.ndarray, label: np.ndarray, k: int) -> float:
    """networkx's ``modularity`` of a partition (resolution 1), its terms summed in node order (see above)."""
    deg_sum = float(_SUM(degree))
    return float(_CONTRIBUTIONS(degree, inside, label, k, deg_sum / 2, 1 / deg_sum**2))


def communities(n: int, first: np.ndarray, second: np.ndarray, weight: np.ndarray, seed: int) -> np.ndarray:
    """The community of each of ``n`` nodes (numbered in the order networkx lists the communities' first level
    ids; only the grouping matters), for a graph whose edges (``first[k]``, ``second[k]``, ``weight[k]``) are
    added in that order, as ``networkx.community.louvain_communities(G, weight="weight", seed=seed)``."""
    if len(first) == 0:  # networkx: an empty graph is its singletons
        return np.arange(n)
    rng = random.Random(seed)
    as_given = _ADJACENCY(n, first, second, weight)
    # louvain_partitions copies G: the copy's edges are added in G.edges order
    pointer, neighbour, weights = _ADJACENCY(n, *_EDGES_IN_ORDER(*as_given))
    degree = _DEGREES(pointer, neighbour, weights)
    m = float(_SUM(degree)) / 2
    twice_m_squared = 2 * m**2  # Python's pow, as networkx takes it
    given_degree = _DEGREES(*as_given)
    modularity = _modularity(given_degree, np.zeros(n), np.arange(n), n)
    node_of = np.arange(n)  # each original node's node at the current level
    order = list(range(n))
    rng.shuffle(order)
    community, _ = _ONE_LEVEL(pointer, neighbour, weights, degree, m, twice_m_squared, np.array(order, dtype=np.int64))
    improvement = True
    result = node_of
    while improvement:
        label, k = _compact(community)
        result = label[node_of]  # the partition networkx yields for this level
        gained = _modularity(degree, _INTERNAL(pointer, neighbour, weights, label, k), label, k)
        if gained - modularity <= THRESHOLD:
            break
        modularity = gained
        pointer, neighbour, weights = _ADJACENCY(k, *_gen_edges(pointer, neighbour, weights, label))
        degree = _DEGREES(pointer, neighbour, weights)
        node_of = label[node_of]
        order = list(range(k))
        rng.shuffle(order)
        community, improvement = _ONE_LEVEL(
            pointer, neighbour, weights, degree, m, twice_m_squared, np.array(order, dtype=np.int64)
        )
    return result


def _gen_edges(
    pointer: np.ndarray, neighbour: np.ndarray, weight: np.ndarray, label: np.ndarray
) -> tuple[np.ndarray, ...]:
    """networkx's ``_gen_graph``: the edges between communities, in the order the graph's edges come."""
    first, second, value = _EDGES_IN_ORDER(pointer, neighbour, weight)
    return label[first], label[second], value


_ADJACENCY = _jit(_adjacency_py)
_EDGES_IN_ORDER = _jit(_edges_in_order_py)
_DEGREES = _jit(_degrees_py)
_SUM = _jit(_sum_py)
_ONE_LEVEL = _jit(_one_level_py)
_INTERNAL = _jit(_internal_weights_py)
_CONTRIBUTIONS = _jit(_contributions_py)
