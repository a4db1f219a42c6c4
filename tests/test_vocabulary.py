"""The shift-measure vocabulary: defined by the families, one meaning per name, each documented, enforced."""

from __future__ import annotations

import pytest

from shiftbench import registry
from shiftbench.magnitudes import MEASURES, define_measures, magnitudes_table

from .conftest import PROJECT


def test_every_family_with_shift_magnitudes_defines_its_measures_and_each_is_documented() -> None:
    with_magnitudes = [f for f in registry.families().values() if any("shift_magnitudes" in k.tables for k in f.kinds)]
    assert {f.name for f in with_magnitudes} == {"breeds", "metashift", "conds"}
    prefixes = {"breeds": "BREEDS", "metashift": "MetaShift", "conds": "ConDS"}
    for family in with_magnitudes:
        assert any(meaning.startswith(prefixes[family.name]) for meaning in MEASURES.values()), family.name
    documented = (PROJECT / "docs" / "shift_magnitudes.md").read_text("utf-8")
    assert [m for m in MEASURES if f"`{m}`" not in documented] == []


def test_a_measure_is_defined_once_and_rows_use_only_defined_ones() -> None:
    define_measures("breeds", {"subclass_distance_max": MEASURES["subclass_distance_max"]})  # the same: fine
    with pytest.raises(ValueError, match="already defined otherwise"):
        define_measures("other", {"tv_distance": "something else"})
    with pytest.raises(ValueError, match="not in the shift-magnitude vocabulary: made_up"):
        magnitudes_table("conds", [("made_up", "all", 1.0)])
