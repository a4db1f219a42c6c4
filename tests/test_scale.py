"""What makes MetaShift fast at GQA scale gives the answers the plain algorithms give: compiled Louvain against
networkx, vectorised exact sums against math.fsum, pdist against numpy's norm, prefetched batches, and custom
contract rules."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from shiftbench.errors import InputError
from shiftbench.metashift import embedding as em
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.eigensolver import smallest_eigenpairs
from shiftbench.metashift.family import METASHIFT
from shiftbench.metashift.specs import load_specs
from shiftbench.metashift.subsets import candidate_memberships, subset_table
from shiftbench.sources.generated_scenes import generate_scene_tables
from shiftbench.store.contracts import _custom_module_source, load_contract
from shiftbench.tables.streamed import prefetched, regroup
from shiftbench.warehouse.magnitudes import exact_sum

assert METASHIFT.contracts_dir is not None
METASHIFT_CONTRACTS = METASHIFT.contracts_dir


def _networkx_communities(graph: mg.ClassGraph, seed: int) -> list[list[str]]:
    found = nx.community.louvain_communities(graph.to_networkx(), weight="weight", seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: (-len(c), c[0]))


def _random_graph(n: int, p: float, seed: int) -> mg.ClassGraph:
    rng = np.random.default_rng(seed)
    weights = np.zeros((n, n))
    for u, v in nx.gnp_random_graph(n, p, seed=seed).edges:
        weights[u, v] = weights[v, u] = float(rng.uniform(0.2, 1.0))
    return mg.ClassGraph("c", [f"s{k:03d}" for k in range(n)], np.ones(n), sp.csr_array(weights))


@pytest.mark.parametrize("seed", range(12))
def test_compiled_louvain_finds_networkx_s_communities(seed: int) -> None:
    rng = np.random.default_rng(seed)
    graph = _random_graph(int(rng.integers(2, 150)), float(rng.uniform(0.02, 0.4)), seed)
    for louvain_seed in (0, 7):
        assert mg.detect_communities(graph, "louvain", louvain_seed) == _networkx_communities(graph, louvain_seed)


def test_compiled_louvain_on_every_meta_graph_of_the_generated_sample() -> None:
    specs = load_specs()
    objects, images, _ = generate_scene_tables()
    spec = specs.collections["metashift"].with_overrides({"edge_threshold": 0.05})
    memberships = candidate_memberships(objects, images, spec.context_kinds, specs.general_contexts)
    subsets = subset_table(memberships, spec.min_subset_size, spec.min_subsets_per_class)
    nodes = mg.node_order(subsets.filter(pl.col("selected")))
    graphs = mg.class_graphs(nodes, mg.overlap_edges(memberships, nodes, spec.edge_threshold))
    assert len(graphs) >= 5 and max(g.weights.nnz for g in graphs.values()) > 100
    for graph in graphs.values():
        assert mg.detect_communities(graph, "louvain", 0) == _networkx_communities(graph, 0)


def test_compiled_louvain_of_a_graph_without_edges_is_its_singletons() -> None:
    graph = mg.ClassGraph("c", ["a", "b", "c"], np.ones(3), sp.csr_array((3, 3)))
    assert mg.detect_communities(graph, "louvain", 0) == [["a"], ["b"], ["c"]]


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite | st.floats(min_value=-1e-300, max_value=1e-300), max_size=300))
def test_exact_sum_is_math_fsum(values: list[float]) -> None:
    ours, theirs = exact_sum(np.array(values, dtype=np.float64)), math.fsum(values)
    assert ours == theirs and math.copysign(1.0, ours) == math.copysign(1.0, theirs)


def test_exact_sum_of_many_values_and_of_series() -> None:
    values = np.random.default_rng(0).random(3_000_000) * 1e-3  # more than one chunk of 2^20
    assert exact_sum(values) == math.fsum(values.tolist())
    assert exact_sum(pl.Series(values)) == exact_sum(values[::-1])
    assert math.copysign(1.0, exact_sum(np.array([-0.0]))) == math.copysign(1.0, math.fsum([-0.0]))
    assert math.isnan(exact_sum(np.array([1.0, math.nan])))


@pytest.mark.parametrize(("n", "k"), [(1, 1), (5, 2), (60, 7), (501, 7), (900, 1), (30, 30)])
def test_smallest_eigenpairs_are_scipy_s_eigh_bit_for_bit(n: int, k: int) -> None:
    """The GIL-free call of dsyevr gives what scipy.linalg.eigh(driver="evr") gives, to the last bit."""
    import scipy.linalg

    rng = np.random.default_rng(n + k)
    weights = rng.random((n, n))
    weights = np.where(weights + weights.T > 1.2, weights + weights.T, 0.0)
    np.fill_diagonal(weights, 0.0)
    laplacian = np.diag(weights.sum(axis=1)) - weights
    values, vectors = smallest_eigenpairs(laplacian, k)
    expected_values, expected_vectors = scipy.linalg.eigh(laplacian, subset_by_index=[0, k - 1], driver="evr")
    assert np.array_equal(values, expected_values) and np.array_equal(vectors, expected_vectors)
    with pytest.raises(ValueError, match="square matrix"):
        smallest_eigenpairs(laplacian, n + 1)


def test_smallest_eigenpairs_call_lapack_with_python_s_lock_released() -> None:
    """A plain ctypes function (not a Python-API one) releases the GIL for the call: classes on threads overlap."""
    import ctypes

    from shiftbench.metashift.eigensolver import _dsyevr

    assert not _dsyevr()._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


@pytest.mark.parametrize("dim", [1, 2, 5, 7, 8, 9, 12])
def test_pair_distances_sum_the_squares_in_dimension_order(dim: int) -> None:
    """One definition of a distance in every dimension (the catalog's view sums the same way), in any node order."""
    rng = np.random.default_rng(dim)
    n = 60
    coords = rng.standard_normal((n, dim)) * rng.random(dim) * 10
    embedding = em.Embedding(coords, np.zeros(n, dtype=np.int64), np.full(n, "ok", dtype=object), [], "networkx")
    order = rng.permutation(n)
    pairs = em.pair_distances(embedding, order)
    i, j = np.triu_indices(n, k=1)
    squares = np.zeros(len(i))
    for k in range(dim):
        difference = coords[order][i, k] - coords[order][j, k]
        squares += difference * difference
    assert np.array_equal(pairs.raw, np.sqrt(squares))
    assert np.array_equal(pairs.i, i) and np.array_equal(pairs.j, j)
    assert em.point_distance(coords[0], coords[1]) == float(np.sqrt(sum((coords[0] - coords[1]) ** 2)))


def test_prefetched_keeps_order_and_makes_at_most_one_item_ahead() -> None:
    made: list[int] = []

    def items() -> Iterator[int]:
        for k in range(20):
            made.append(k)
            yield k

    seen = []
    for item in prefetched(items()):
        time.sleep(0.002)
        assert len(made) <= item + 2  # the one in hand and the one made ahead
        seen.append(item)
    assert seen == list(range(20))


def test_prefetched_raises_the_maker_s_error_and_stops_when_left() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        list(prefetched(failing()))
    endless = prefetched(iter(range(10**9)))
    assert next(endless) == 0
    endless.close()  # the worker thread ends instead of running on
    assert not any(t.name == "shiftbench-prefetch" and t.is_alive() for t in threading.enumerate())


def test_regroup_cuts_pieces_into_exact_batches() -> None:
    pieces = [(np.arange(a, b), np.arange(a, b) * 2.0) for a, b in [(0, 3), (3, 3), (3, 10), (10, 11)]]
    batches = list(regroup(pieces, 4))
    assert [len(b[0]) for b in batches] == [4, 4, 3]
    assert np.array_equal(np.concatenate([b[0] for b in batches]), np.arange(11))
    assert list(regroup([], 4)) == []


def test_a_custom_rule_runs_only_this_package_s_functions(tmp_path: Path) -> None:
    text = (METASHIFT_CONTRACTS / "metashift_edges.yaml").read_text("utf-8")
    for wrong in ("os:system", "shiftbench.metashift.checks", "shiftbench.metashift.checks:not-a-name"):
        path = tmp_path / "metashift_edges.yaml"
        path.write_text(text.replace("shiftbench.metashift.checks:edge_overlap_mismatches", wrong), "utf-8")
        with pytest.raises(InputError, match=r"engine: shiftbench and implementation") as caught:
            load_contract(path)
        assert str(path) in str(caught.value)


def test_a_custom_rule_s_code_is_part_of_its_contract_s_fingerprint() -> None:
    """Editing the code of a rule invalidates earlier check records, as editing the YAML does."""
    import hashlib

    path = METASHIFT_CONTRACTS / "metashift_edges.yaml"
    contract = load_contract(path)
    (rule,) = [q for q in contract.schema.quality or [] if q.type == "custom"]
    text = path.read_text("utf-8").encode("utf-8")
    assert contract.sha256 == hashlib.sha256(text + _custom_module_source(rule, path)).hexdigest()
    assert contract.sha256 != hashlib.sha256(text).hexdigest()


def test_reading_in_worker_processes_needs_no_main_guard_in_the_caller_s_script(tmp_path: Path) -> None:
    """Several files are decoded in worker processes; a user's script without `if __name__ == "__main__"` must
    still run once (multiprocessing's spawn would run it again in every worker, which would start workers)."""
    import subprocess
    import sys

    for k in range(3):
        objects = '{"1": {"name": "cat", "attributes": ["black"]}, "2": {"name": "sofa"}}'
        (tmp_path / f"part{k}.json").write_text(f'{{"{k}": {{"objects": {objects}}}}}')
    script = tmp_path / "user_script.py"
    script.write_text(
        "from pathlib import Path\n"
        "from shiftbench.sources.scene_graphs import read_gqa_scene_graphs\n"
        "print('the script ran', flush=True)\n"
        f"scene = read_gqa_scene_graphs(sorted(Path({str(tmp_path)!r}).glob('part*.json')), workers=2)\n"
        "print(scene.objects.height, scene.images.height)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["the script ran", "6 3"]


def test_a_bad_file_read_in_a_worker_process_is_the_same_one_line_error(tmp_path: Path) -> None:
    from shiftbench.sources.scene_graphs import read_gqa_scene_graphs

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"1": {"objects": {"5": {"name": "cat"}}}}')
    bad.write_text('{"2": {"objects": {"6": {"name": 7}}}}')
    with pytest.raises(InputError, match=r"bad.json: image '2', object '6': object 'name' is not a string") as caught:
        read_gqa_scene_graphs([good, bad], workers=2)
    assert caught.value.path == str(bad) and caught.value.__cause__ is None


def test_strings_in_runs_are_a_take() -> None:
    import pyarrow as pa

    from shiftbench.tables.streamed import strings_in_runs

    values = pa.array(["a", "bb", "", "ccc"], type=pa.large_string())
    for codes in ([], [2], [0, 0, 0, 1, 1, 3, 3, 3, 0, 2, 2], [3, 2, 1, 0]):
        array = np.array(codes, dtype=np.int32)
        assert strings_in_runs(values, array).equals(values.take(array))


def test_the_streamed_distance_table_is_every_pair_sorted_as_the_store_sorts_it() -> None:
    """With store_distances (small collections): made from codes in subset-name order with pdist, the same rows as
    the plain construction, sorted."""
    from shiftbench.metashift import build, collection

    specs = load_specs()
    objects, images, _ = generate_scene_tables()
    spec = specs.collections["metashift"].with_overrides({"store_distances": True})
    tables, results, _ = collection.build_collection(spec, objects, images, specs.general_contexts, {})
    streamed = tables["metashift_distances"]
    assert not isinstance(streamed, pl.DataFrame)
    rows = []
    for name, result in results.items():  # the construction before streaming: node order, numpy's norm, then sorted
        coords, nodes = result.embedding.coords, result.graph.nodes
        pairs = em.pair_distances(result.embedding)
        norms = np.sqrt(((coords[pairs.i] - coords[pairs.j]) ** 2).sum(axis=1)).tolist()
        for i, j, raw, status in zip(pairs.i.tolist(), pairs.j.tolist(), norms, pairs.status.tolist(), strict=True):
            a, b = sorted((nodes[i], nodes[j]))
            rows.append((name, a, b, raw if status == "ok" else None, raw, status))
    expected = pl.DataFrame(rows, schema=build.DISTANCE_SCHEMA, orient="row").sort(list(build.DISTANCE_SCHEMA))
    got = streamed.collect()
    assert got.height == streamed.height == expected.height > 10_000
    assert got.equals(expected)


def test_coded_objects_hash_as_their_strings_batch_by_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    from shiftbench.sources.scene_codes import CodedObjects
    from shiftbench.tables import fingerprint

    objects, _, _ = generate_scene_tables()
    objects = objects.sort("image_id", "object_id")
    coded = CodedObjects.from_strings(objects)
    assert coded.strings().equals(objects)
    whole = fingerprint.sha256_frames([objects])
    assert coded.sha256() == whole
    monkeypatch.setattr(fingerprint, "BATCH_ROWS", 777)  # several batches: each made from the codes on its own
    assert coded.sha256() == fingerprint.sha256_frames([objects]) != whole
    assert coded.strings(100, 50).equals(objects.slice(100, 50))
    # Attribute lists that are NULL keep their bitmap's bytes: the same hash as the string table's.
    with_nulls = objects.with_columns(
        pl.when(pl.int_range(pl.len()) % 5 == 1).then(None).otherwise(pl.col("attributes")).alias("attributes")
    )
    coded = CodedObjects.from_strings(with_nulls)
    assert coded.strings().equals(with_nulls)
    assert coded.sha256() == fingerprint.sha256_frames([with_nulls])
    monkeypatch.setattr(fingerprint, "BATCH_ROWS", fingerprint.BATCH_ROWS * 10**4)
    assert coded.sha256() == fingerprint.sha256_frames([with_nulls])
    empty = CodedObjects.from_strings(objects.clear())
    assert empty.sha256() == fingerprint.sha256_frames([objects.clear()])


@pytest.mark.parametrize("kinds", [["object", "attribute", "general"], ["attribute"]])
def test_memberships_and_edges_by_packed_keys_equal_the_plain_sets(
    kinds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shiftbench.metashift import subsets as ss

    specs = load_specs()
    objects, images, _ = generate_scene_tables()

    def built() -> tuple[pl.DataFrame, pl.DataFrame]:
        memberships = candidate_memberships(objects, images, kinds, specs.general_contexts)
        subsets = subset_table(memberships, 5, 2)
        nodes = mg.node_order(subsets.filter(pl.col("selected")))
        return memberships.frame(), mg.overlap_edges(memberships, nodes, 0.05)

    frame, edges = built()
    # The same from plain sets: each subset's images, and the overlap of every pair of a class's subsets.
    images_of: dict[str, set[str]] = {}
    for subset, image_id in frame.select("subset", "image_id").iter_rows():
        images_of.setdefault(subset, set()).add(image_id)
    assert frame.height == sum(len(v) for v in images_of.values())
    assert frame.select("subset", "image_id").equals(frame.select("subset", "image_id").sort("subset", "image_id"))
    for cls, a, b, shared, overlap in edges.iter_rows():
        assert a < b and a.startswith(f"{cls}(") and b.startswith(f"{cls}(")
        assert shared == len(images_of[a] & images_of[b])
        assert overlap == shared / min(len(images_of[a]), len(images_of[b]))
    assert edges.height > 50
    # The fallbacks (keys wider than 64 bits) and many small chunks give the same tables.
    monkeypatch.setattr(ss, "KEY_BITS", 8)
    monkeypatch.setattr(mg, "KEY_BITS", 8)
    monkeypatch.setattr(mg, "OVERLAP_CHUNK", 500)
    again, again_edges = built()
    assert again.equals(frame) and again_edges.equals(edges)


def test_gqa_files_read_as_codes_fingerprint_as_the_string_tables(tmp_path: Path) -> None:
    """The coded reader (runs of objects moved into image order, object ids out of order within an image, two
    files, an object without attributes) gives the strings, and the fingerprint, of the string tables."""
    from shiftbench.sources.scene_graphs import SceneTables, read_gqa_scene_graphs

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(
        '{"z9": {"objects": {"9": {"name": "cat", "attributes": ["black", "small"]}, "10": {"name": "sofa"}},'
        ' "location": "indoors"}, "a1": {"objects": {"3": {"name": "dog", "attributes": ["white"]}}}}'
    )
    second.write_text('{"m5": {"objects": {"2": {"name": "cat", "attributes": []}, "1": {"name": "grass"}}}}')
    for workers in (1, 2):
        scene = read_gqa_scene_graphs([first, second], workers=workers)
        objects = scene.objects
        assert objects.select("image_id", "object_id").rows() == [
            ("a1", "3"), ("m5", "1"), ("m5", "2"), ("z9", "10"), ("z9", "9")
        ]  # fmt: skip
        assert objects.filter(pl.col("object_id") == "9")["attributes"].to_list() == [["black", "small"]]
        again = SceneTables.from_frames(objects.reverse(), scene.images.reverse(), "", scene.kind)
        assert again.fingerprint == scene.fingerprint


def test_edge_rule_counts_shared_images_as_sets() -> None:
    """The edge rule's compiled count is |A ∩ B| of plain sets, for memberships in any order, repeated rows
    included, whichever end is marked."""
    from shiftbench.metashift.checks import _grouped, _shared_counts

    rng = np.random.default_rng(3)
    n_subsets, n_images = 40, 300
    codes = rng.integers(0, n_subsets, 5_000).astype(np.uint32)
    images = rng.integers(0, n_images, 5_000).astype(np.uint32)
    offsets, grouped = _grouped(codes, images, n_subsets)
    members = [set(images[codes == k].tolist()) for k in range(n_subsets)]
    assert all(set(grouped[offsets[k] : offsets[k + 1]].tolist()) == members[k] for k in range(n_subsets))
    small, large = rng.integers(0, n_subsets, (2, 500))
    order = np.argsort(large, kind="stable")
    shared = _shared_counts(offsets, grouped, small[order], large[order], n_images)
    expected = [len(members[s] & members[t]) for s, t in zip(small[order], large[order], strict=True)]
    assert shared.tolist() == expected


@pytest.mark.parametrize("kinds", [["object", "attribute", "general"], ["attribute"], ["object"]])
def test_each_class_built_alone_has_the_plain_sets_sizes_and_overlaps(
    kinds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-class work (compiled counts over the scene index, a k x k co-occurrence matrix) gives every candidate
    the size of its plain set of images, and every pair of selected subsets their plain |A ∩ B|; the sparse product
    that takes over for very large classes gives the same edges."""
    from shiftbench.metashift import classes as mc
    from shiftbench.metashift.index import build_index

    specs = load_specs()
    objects, images, _ = generate_scene_tables()
    frame = candidate_memberships(objects, images, kinds, specs.general_contexts).frame()
    images_of: dict[str, set[str]] = {}
    for subset, image_id in frame.select("subset", "image_id").iter_rows():
        images_of.setdefault(subset, set()).add(image_id)
    from shiftbench.sources.scene_codes import CodedObjects

    index = build_index(CodedObjects.from_strings(objects), images, kinds, specs.general_contexts)
    settings = mc.ClassSettings(5, 2, None, 0.0, "paper", 3, "louvain", 0)
    counts = np.zeros(len(index.vocabulary), dtype=np.int64)
    outcomes = [mc.build_class(index, int(code), settings, counts) for code in index.classes]
    sizes = {n: int(s) for o in outcomes for n, s in zip(o.listed.subsets, o.listed.sizes, strict=True)}
    assert sizes == {name: len(v) for name, v in images_of.items() if len(v) >= 5}
    assert sum(sum(o.counts.values()) for o in outcomes) == len(images_of)
    edges = pl.concat([o.result.edges for o in outcomes if o.result is not None])
    for cls, a, b, shared, overlap in edges.iter_rows():
        assert a < b and a.startswith(f"{cls}(") and b.startswith(f"{cls}(")
        assert shared == len(images_of[a] & images_of[b]) > 0
        assert overlap == shared / min(len(images_of[a]), len(images_of[b]))
    expected = sum(
        1
        for o in outcomes
        if o.result is not None
        for x, y in itertools.combinations(o.result.graph.nodes, 2)
        if images_of[x] & images_of[y]
    )
    assert edges.height == expected > 50
    monkeypatch.setattr(mc, "DENSE_COOCCURRENCE_MAX", 3)
    sparse = [mc.build_class(index, int(code), settings, counts) for code in index.classes]
    assert pl.concat([o.result.edges for o in sparse if o.result is not None]).equals(edges)
