"""Spectral embeddings of meta-graphs and the distances between subsets they define.

Two named methods:

``paper``
    The paper's definition (Section 3.2): the Laplacian L = D - A of the weighted meta-graph,
    embedding = eigenvectors of eigenvalues λ2..λ(K+1). Computed **per connected component**:
    a Laplacian with c components has a c-dimensional null space whose basis is arbitrary, so
    coordinates of different components are not comparable and their distance is undefined
    (published as NULL, status ``different_components``). Eigenvectors are sign-normalised
    (largest-magnitude entry positive). Distances are invariant to the basis chosen inside an
    eigenspace as long as the eigenspace lies wholly within λ2..λ(K+1); when λ(K+1) = λ(K+2)
    the cut splits an eigenspace, the distances of that component depend on the solver, and
    they are published as NULL with status ``degenerate_eigenvalues`` (raw value kept).
    Components of up to 6,000 nodes use LAPACK's dense MRRR solver for the k smallest eigenpairs
    (exact, deterministic); larger ones ARPACK in shift-invert mode with a fixed start vector.

``networkx``
    Exactly what the released scripts used: ``networkx.spectral_layout(G, dim=K)``, i.e. the
    dense ``numpy.linalg.eig`` of the whole graph's weighted Laplacian, eigenvectors 1..K in
    ascending eigenvalue order, centred and scaled so the largest absolute coordinate is 1.
    The same float operations in the same order give bit-identical positions (tested against
    networkx) below 500 nodes; the eigenvalues kept are the dim + 2 smallest. Graphs with 2 nodes put
    both at the origin (networkx's rule) -> status ``too_few_nodes``. With several components the
    chosen null-space vectors are arbitrary:
    distances across components are NULL (``different_components``, whatever else holds), and if
    the final scaling is set by such a vector, every other distance of the graph is flagged
    ``degenerate_eigenvalues``. From 500 nodes networkx switches to ARPACK with a random start
    (not reproducible, and accurate to its tolerance of 1e-4); this mode takes the symmetric dense
    solver (``eigh``, its dim + 2 smallest eigenpairs only) there: the same eigenvectors up to sign and
    rounding, so the same distances up to rounding (a column's sign does not change a distance),
    deterministic, and 10x faster than the general ``eig`` on a 1,700-node class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import eigsh
from scipy.spatial.distance import pdist

from shiftbench.errors import InputError
from shiftbench.metashift.eigensolver import smallest_eigenpairs

EMBEDDINGS = ("paper", "networkx")
STATUSES = ("ok", "different_components", "degenerate_eigenvalues", "too_few_nodes")
MAX_EMBEDDING_DIM = 64  # the paper uses 5
_DENSE_MAX = 6000  # components up to this size: the dense solver (288 MB at most); ARPACK beyond
NETWORKX_SPARSE_FROM = 500  # networkx.spectral_layout switches to (unseeded) ARPACK at this many nodes
_RTOL = 1e-8


@dataclass(frozen=True)
class Embedding:
    coords: np.ndarray  # (n, dim)
    component: np.ndarray  # (n,) component id, 0 = largest
    component_status: np.ndarray  # (n,) status of the node's component (ok / degenerate / too_few)
    eigenvalues: list[list[float]]  # per component (paper) or one list for the graph (networkx)
    method: str


def check_embedding(method: str, dim: int) -> None:
    if method not in EMBEDDINGS:
        raise InputError(f"must be one of {', '.join(EMBEDDINGS)}, got {method!r}", parameter="embedding")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_EMBEDDING_DIM:
        # The bound keeps a typo from allocating a (nodes x dim) array of many GiB.
        raise InputError(f"must be an integer in 1..{MAX_EMBEDDING_DIM}, got {dim!r}", parameter="embedding_dim")


def components(weights: sp.csr_array) -> np.ndarray:
    """Component ids numbered by size (largest first), ties by first node."""
    n = weights.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, labels = connected_components(weights, directed=False)
    sizes = np.bincount(labels)
    first = np.array([np.flatnonzero(labels == c)[0] for c in range(len(sizes))])
    order = sorted(range(len(sizes)), key=lambda c: (-sizes[c], first[c]))
    rank = np.empty(len(sizes), dtype=np.int64)
    rank[order] = np.arange(len(sizes))
    result: np.ndarray = rank[labels]
    return result


def _tied(a: float, b: float) -> bool:
    return abs(a - b) <= _RTOL * max(1.0, abs(a), abs(b))


def _normalise_signs(vectors: np.ndarray) -> np.ndarray:
    """Flip each column so its largest-magnitude entry (first on ties) is positive: a fixed choice."""
    if vectors.size == 0:
        return vectors
    pivot = np.argmax(np.abs(vectors) - 1e-12 * np.arange(vectors.shape[0])[:, None], axis=0)
    signs = np.sign(vectors[pivot, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1.0
    normalised: np.ndarray = vectors * signs
    return normalised


def _component_eigenpairs(laplacian: sp.csr_array, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest eigenpairs of a component's Laplacian: LAPACK's MRRR (``evr``) on the dense matrix, asked
    for those only (exact, deterministic; 1,700 nodes in 0.26 s), or ARPACK in shift-invert mode with a fixed start
    for components too large to hold densely."""
    n = laplacian.shape[0]
    if n <= _DENSE_MAX or k >= n - 1:
        return smallest_eigenpairs(laplacian.toarray(), k)
    v0 = np.cos(np.arange(n, dtype=np.float64) + 0.5)  # fixed start: ARPACK is otherwise random
    values, vectors = eigsh(laplacian.tocsc(), k=k, sigma=-1.0, which="LM", v0=v0)
    order = np.argsort(values)
    return values[order], vectors[:, order]


def paper_embedding(weights: sp.csr_array, dim: int) -> Embedding:
    """Laplacian eigenmap per connected component (see the module docstring)."""
    n = weights.shape[0]
    comp = components(weights)
    coords = np.zeros((n, dim))
    status = np.full(n, "ok", dtype=object)
    eigenvalues: list[list[float]] = []
    degree = np.asarray(weights.sum(axis=1)).ravel()
    laplacian = sp.csr_array(sp.diags_array(degree) - weights)
    for c in range(int(comp.max()) + 1 if n else 0):
        members = np.flatnonzero(comp == c)
        size = len(members)
        if size == 1:
            eigenvalues.append([0.0])
            continue
        sub = laplacian[members][:, members]
        k = min(dim + 2, size)
        values, vectors = _component_eigenpairs(sp.csr_array(sub), k)
        used = min(dim, size - 1)
        coords[np.ix_(members, np.arange(used))] = _normalise_signs(vectors[:, 1 : used + 1])
        eigenvalues.append([float(v) for v in values])
        if size > dim + 1 and _tied(values[dim], values[dim + 1]):
            status[members] = "degenerate_eigenvalues"
    return Embedding(coords, comp, status, eigenvalues, "paper")


def networkx_layout(adjacency: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """networkx ``spectral_layout(G, dim)`` positions of a dense adjacency (same operations, same order).

    Returns (positions, eigenvalues of the selected columns, centred columns before scaling).
    Below 3 nodes networkx places every node at the centre.
    """
    n = adjacency.shape[0]
    if n <= 2:
        return np.zeros((n, dim)), np.zeros(0), np.zeros((n, 0))
    degree_matrix = np.identity(n, dtype=adjacency.dtype) * np.sum(adjacency, axis=1)
    laplacian = degree_matrix - adjacency
    if n < NETWORKX_SPARSE_FROM:
        values, vectors = np.linalg.eig(laplacian)  # networkx's own call: bit-identical positions
    else:
        # networkx's ARPACK is unseeded here; the symmetric dense solver is exact and deterministic, and asked for
        # the dim + 2 smallest eigenpairs only (LAPACK's MRRR) it is 3x faster than all of them (1,698 nodes:
        # 0.26 s against 0.71 s on one thread)
        values, vectors = smallest_eigenpairs(laplacian, min(dim + 2, n))
    index = np.argsort(values)[1 : dim + 1]
    pos = np.real(vectors[:, index])
    pos -= pos.mean(axis=0)
    centred = pos.copy()
    lim = np.abs(pos).max()
    if lim > 0:
        pos *= 1 / lim
    # Fewer than dim columns: networkx fails (it adds a dim-long centre); pad with zeros instead.
    pos = np.hstack([pos, np.zeros((n, dim - pos.shape[1]))]) if pos.shape[1] < dim else pos + np.zeros(dim)
    return pos, np.real(values[np.argsort(values)])[: dim + 2], centred


def networkx_embedding(weights: sp.csr_array, dim: int) -> Embedding:
    n = weights.shape[0]
    comp = components(weights)
    coords, values, centred = networkx_layout(weights.toarray(), dim)
    status = np.full(n, "ok", dtype=object)
    if n <= 2:
        status[:] = "too_few_nodes"
    else:
        selected = min(dim, n - 1)
        degenerate = selected + 1 < n and _tied(values[selected], values[selected + 1])
        # With several components, the selected null-space vectors are an arbitrary basis. They
        # are constant on each component, so within a component they only act through the final
        # scaling: flag the graph when one of them sets the scale.
        is_null = np.array([_tied(v, 0.0) for v in values[1 : selected + 1]], dtype=bool)
        if is_null.any():
            null_max = np.abs(centred[:, is_null]).max()
            rest_max = np.abs(centred[:, ~is_null]).max() if (~is_null).any() else 0.0
            degenerate = degenerate or null_max >= rest_max
        if degenerate:
            status[:] = "degenerate_eigenvalues"
    return Embedding(coords, comp, status, [[float(v) for v in values]], "networkx")


def embed(weights: sp.csr_array, dim: int, method: str) -> Embedding:
    check_embedding(method, dim)
    return paper_embedding(weights, dim) if method == "paper" else networkx_embedding(weights, dim)


@dataclass(frozen=True)
class PairDistances:
    i: np.ndarray
    j: np.ndarray
    raw: np.ndarray  # Euclidean distance between the published coordinates
    distance: np.ndarray  # raw where defined, NaN elsewhere
    status_code: np.ndarray  # index into STATUSES

    @property
    def status(self) -> np.ndarray:
        names: np.ndarray = np.asarray(STATUSES)[self.status_code]
        return names


# One definition of a distance, here and in the catalog's view (data_contracts/metashift/
# metashift_distances.sql): the squared differences summed in dimension order, then the square root. scipy's
# pdist sums so for every dimension (tested), and so does the view's list_reduce; numpy's norm would sum
# pairwise from 8 dimensions on (other last bits).


def pair_distances(embedding: Embedding, order: np.ndarray | None = None) -> PairDistances:
    """Every pair i < j of the nodes taken in ``order`` (default: node order), row by row (``i`` and ``j`` are
    positions in ``order``): Euclidean distance, NULL (NaN) where the embedding does not define it.

    A pair's distance does not depend on its orientation (the squares of negated differences are the same), so
    any node order gives the same floats for the same pair.
    """
    coords = embedding.coords if order is None else embedding.coords[order]
    n = coords.shape[0]
    i, j = np.triu_indices(n, k=1)
    raw = pdist(coords) if n > 1 else np.zeros(0)  # condensed: the same row-by-row order as triu_indices
    component = embedding.component if order is None else embedding.component[order]
    node_status = np.array([STATUSES.index(str(s)) for s in embedding.component_status], dtype=np.int8)
    if order is not None:
        node_status = node_status[order]
    # A pair across components is undefined whatever else is true of the graph, so that status wins;
    # within a component the component's (networkx: the whole graph's) status applies.
    status = np.where(
        component[i] != component[j],
        np.int8(STATUSES.index("different_components")),
        node_status[i],
    ).astype(np.int8)
    distance = np.where(status == 0, raw, np.nan)
    return PairDistances(i, j, raw, distance, status)


def point_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The distance of two points, by the same definition as :func:`pair_distances` (and the catalog's view)."""
    return float(pdist(np.vstack([a, b]))[0])
