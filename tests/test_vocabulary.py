"""The shift-measure vocabulary: defined by the families, one meaning per name, each documented, enforced."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import BaseModel

from shiftbench.config.family_registry import REGISTRY
from shiftbench.families import registry
from shiftbench.warehouse.magnitudes import magnitudes_table, measures, vocabulary

from .conftest import PROJECT


def test_every_family_with_shift_magnitudes_defines_its_measures_and_each_is_documented() -> None:
    with_magnitudes = [f for f in registry.families().values() if any("shift_magnitudes" in k.tables for k in f.kinds)]
    assert {f.name for f in with_magnitudes} == {"breeds", "metashift", "conds"}
    prefixes = {"breeds": "BREEDS", "metashift": "MetaShift", "conds": "ConDS"}
    for family in with_magnitudes:
        assert family.measures and all(m.startswith(prefixes[family.name]) for m in family.measures.values())
    documented = (PROJECT / "docs" / "shift_magnitudes.md").read_text("utf-8")
    assert [m for m in vocabulary() if f"`{m}`" not in documented] == []


@dataclass(frozen=True)
class _Other:
    """A family (as the registry sees one) that gives a word of ConDS another meaning."""

    name: str = "other"
    settings: type[BaseModel] | None = None
    contracts_dir: Path | None = None
    measures: dict[str, str] = field(default_factory=lambda: {"tv_distance": "something else"})


def test_a_measure_is_defined_once_and_rows_use_only_their_family_s() -> None:
    assert measures("conds")["tv_distance"] == vocabulary()["tv_distance"]
    REGISTRY.register(_Other())
    try:
        with pytest.raises(ValueError, match="'tv_distance' of other is already defined otherwise"):
            vocabulary()
    finally:
        REGISTRY.unregister("other")
    with pytest.raises(ValueError, match="not in the shift-magnitude vocabulary: made_up"):
        magnitudes_table("conds", [("made_up", "all", 1.0)])
    with pytest.raises(ValueError, match="not in the shift-magnitude vocabulary: subclass_distance_max"):
        magnitudes_table("conds", [("subclass_distance_max", "all", 1.0)])  # a BREEDS word, not ConDS'
