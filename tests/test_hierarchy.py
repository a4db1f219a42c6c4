"""Hierarchy basics: longest-path levels, restriction, reachable classes, validation."""

from __future__ import annotations

import pytest

from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import Hierarchy

R = "n00001740"


def test_level_is_the_longest_path_from_the_root() -> None:
    h = Hierarchy.from_edges([(R, "a"), ("a", "b"), ("b", "c"), (R, "c")], {})
    assert h.levels == {R: 0, "a": 1, "b": 2, "c": 3}


def test_restriction_keeps_only_ancestors_of_classes() -> None:
    h = Hierarchy.from_edges([(R, "a"), ("a", "x"), (R, "b"), ("b", "y")], {"x": "X"})
    restricted = h.restrict_to_ancestors(["x"])
    assert set(restricted.edges) == {(R, "a"), ("a", "x")}
    assert restricted.reachable_classes("a", frozenset({"x"})) == ["x"]
    assert restricted.reachable_classes("x", frozenset({"x"})) == ["x"]  # a class counts itself


def test_validation_finds_unreachable_nodes_and_classes() -> None:
    h = Hierarchy.from_edges([(R, "a"), ("b", "c")], {})
    with pytest.raises(InputError, match="not reachable from root"):
        h.validate()
    ok = Hierarchy.from_edges([(R, "a")], {})
    with pytest.raises(InputError, match="dataset class"):
        ok.validate(["zzz"])
