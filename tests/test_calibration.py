"""Calibration edits: semantics, file errors, and the WordNet -> BREEDS round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shiftbench.errors import InputError
from shiftbench.sources.breeds_hierarchy import read_breeds_hierarchy_dir
from shiftbench.sources.calibration import (
    Edit,
    apply_edits,
    diff,
    format_edits,
    parse_edits,
    read_edit_file,
    tree_edits,
)
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.sources.wordnet import load_wordnet

from .conftest import BREEDS_FIXTURE, TEST_CACHE

R = "n00001740"


def toy() -> Hierarchy:
    # R -> a -> {b, c}; R -> d -> c (c has two parents); b -> e
    edges = [(R, "a"), ("a", "b"), ("a", "c"), (R, "d"), ("d", "c"), ("b", "e")]
    return Hierarchy.from_edges(edges, {n: n.upper() for n in (R, "a", "b", "c", "d", "e")})


def same(a: Hierarchy, b: Hierarchy) -> bool:
    return a.edges == b.edges and {n: a.name(n) for n in a.nodes} == {n: b.name(n) for n in b.nodes}


def test_collapse_links_each_parent_to_each_child() -> None:
    result = apply_edits(toy(), parse_edits("collapse_node a"))
    assert set(result.edges) == {(R, "b"), (R, "c"), (R, "d"), ("d", "c"), ("b", "e")}


def test_insert_node_above_pushes_a_node_down() -> None:
    result = apply_edits(toy(), parse_edits("insert_node_above c dummy7 the c group"))
    assert set(result.parents("dummy7")) == {"a", "d"}
    assert result.parents("c") == ["dummy7"]
    assert result.name("dummy7") == "the c group"
    assert result.levels["c"] == toy().levels["c"] + 1


def test_delete_node_removes_its_edges_and_add_edge_reattaches() -> None:
    result = apply_edits(toy(), parse_edits("delete_node b\nadd_edge a e\n"))
    assert "b" not in result.graph
    assert ("a", "e") in result.edges


def test_remove_edge_and_rename() -> None:
    result = apply_edits(toy(), parse_edits("remove_edge d c  # keep c under a only\nrename_node c Cee, see"))
    assert result.parents("c") == ["a"]
    assert result.name("c") == "Cee, see"


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("collapse_node a\nsquash_node b\n", "unknown operation 'squash_node'", 2),
        ("add_edge a\n", "expected 'add_edge ID1 ID2'", 1),
        ("\n\ndelete_node a b\n", "expected 'delete_node ID1'", 3),
        ("rename_node a\n", "rename_node needs a name", 1),
    ],
)
def test_malformed_edit_files_name_the_line(tmp_path: Path, text: str, message: str, line: int) -> None:
    path = tmp_path / "edits.txt"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as info:
        read_edit_file(path)
    assert info.value.line == line
    assert info.value.path == str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("collapse_node zz", "unknown node zz"),
        (f"delete_node {R}", "cannot delete the root"),
        ("add_edge a b", "edge already exists"),
        ("remove_edge a d", "no such edge"),
        ("insert_node_above b d", "node d already exists"),
    ],
)
def test_edits_that_do_not_fit_the_graph_are_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        apply_edits(toy(), parse_edits(text, "my.edits"), "my.edits")
    assert info.value.line == 1


def test_tree_rule_keeps_the_deepest_parent_and_every_level() -> None:
    h = Hierarchy.from_edges([(R, "a"), ("a", "b"), (R, "c"), ("b", "x"), ("c", "x"), ("a", "y"), ("c", "y")], {})
    tree = apply_edits(h, tree_edits(h))
    assert tree.is_tree()
    assert tree.parents("x") == ["b"]  # b is at level 2, c at level 1
    assert tree.parents("y") == ["a"]  # tie at level 1: smallest id
    assert tree.levels == h.levels


@pytest.mark.slow
def test_wordnet_plus_diff_is_exactly_the_breeds_hierarchy(fixtures: Path) -> None:
    breeds = read_breeds_hierarchy_dir(BREEDS_FIXTURE)
    classes = [wnid for _, wnid, _ in breeds.dataset_classes]
    wordnet_tables = load_wordnet(Path("/usr/share/wordnet"), TEST_CACHE)
    wordnet = Hierarchy.from_tables(wordnet_tables.edges, wordnet_tables.nodes).restrict_to_ancestors(classes)
    assert not wordnet.is_tree()
    edits = diff(wordnet, breeds.hierarchy)
    ops = {edit.op for edit in edits}
    assert {"collapse_node", "insert_node_above", "delete_node", "add_edge", "rename_node"} <= ops
    # Through the file format, as a user would store it.
    calibrated = apply_edits(wordnet, parse_edits(format_edits(edits)))
    assert same(calibrated, breeds.hierarchy)
    assert len(calibrated.edges) == 1327
    assert calibrated.name("n00021939") == "non-living thing"


names = st.sampled_from([f"x{i}" for i in range(8)])


@st.composite
def dags(draw: st.DrawFn) -> Hierarchy:
    """Random rooted DAGs: nodes in a random order, edges only forward, every node reachable."""
    nodes = draw(st.lists(names, unique=True, min_size=1, max_size=7))
    order = [R, *nodes]
    edges = set()
    for index, node in enumerate(order[1:], start=1):
        parents = draw(st.lists(st.sampled_from(order[:index]), min_size=1, max_size=3, unique=True))
        edges |= {(p, node) for p in parents}
    labels = {n: draw(st.sampled_from(["a", "b", n])) for n in order}
    return Hierarchy.from_edges(edges, labels)


@st.composite
def dags_with_new_nodes(draw: st.DrawFn) -> Hierarchy:
    base = draw(dags())
    extra = draw(st.lists(st.sampled_from(["dummy1", "dummy2"]), unique=True, max_size=2))
    edges = set(base.edges)
    names_ = dict(base.names)
    for node in extra:  # a new inner node above some existing non-root node
        children = [n for n in base.nodes if n != R]
        if not children:
            continue
        child = draw(st.sampled_from(children))
        edges |= {(p, node) for p in base.parents(child)} | {(node, child)}
        edges -= {(p, child) for p in base.parents(child)}
        names_[node] = f"new {node}"
    return Hierarchy.from_edges(edges, names_)


@settings(max_examples=150, deadline=None)
@given(source=dags(), target=dags_with_new_nodes())
def test_diff_then_apply_reaches_any_target(source: Hierarchy, target: Hierarchy) -> None:
    assert same(apply_edits(source, diff(source, target)), target)


def test_edit_lines_round_trip() -> None:
    edits = [Edit("insert_node_above", ("a", "dummy1"), "two words"), Edit("remove_edge", ("a", "b"))]
    assert [(e.op, e.nodes, e.name) for e in parse_edits(format_edits(edits))] == [
        (e.op, e.nodes, e.name) for e in edits
    ]
