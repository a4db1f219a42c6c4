"""One definition of a group (shiftbench.scoring.grouper): names, codes, the split's own groups, and the search
that finds no other code naming groups."""

from __future__ import annotations

import re

import pytest

from shiftbench.errors import InputError
from shiftbench.scoring.grouper import Grouper, cell_name, require_fields

from .conftest import PROJECT


def test_fields_name_groups_in_the_order_given_and_codes_index_the_sorted_names() -> None:
    grouper = Grouper.parse("y, object_color")
    assert grouper.fields == ("y", "object_color") and not grouper.own
    codes, names = grouper.assign([["1", "0", "1"], ["blue", "red", None]])
    assert names == ["y=0,object_color=red", "y=1,object_color=NULL", "y=1,object_color=blue"]
    assert codes.tolist() == [2, 0, 1]
    assert Grouper.parse(["y", "object_color"]) == grouper


@pytest.mark.parametrize("spec", [None, "", "group", ["group"], " , "])
def test_nothing_or_group_is_the_split_s_own_groups(spec: object) -> None:
    grouper = Grouper.parse(spec)  # type: ignore[arg-type]
    assert grouper.own
    assert grouper.assign([["shape=heart|size=big", "shape=square|size=big"]])[1] == [
        "shape=heart|size=big",
        "shape=square|size=big",
    ]


def test_cells_are_named_as_the_split_s_own_groups_and_unknown_fields_are_named() -> None:
    assert cell_name(["shape", "size"], ["heart", "big"]) == "shape=heart|size=big"
    with pytest.raises(InputError, match="unknown metadata field 'colour'; this split has: group, y"):
        require_fields(Grouper.parse("y,colour"), ["group", "y"], parameter="group_by", what="this split")


def test_no_other_code_names_groups() -> None:
    """Group names are field=value pairs joined: nowhere in the package but the grouper writes one."""
    pattern = re.compile(r"""["'][|,]["']\s*\.join\(\s*f["']\{|concat_str\(\s*\[\s*pl\.lit\(f["']\{""")
    found = [
        str(path.relative_to(PROJECT))
        for path in sorted((PROJECT / "shiftbench").rglob("*.py"))
        if path.name != "grouper.py" and pattern.search(path.read_text("utf-8"))
    ]
    assert found == []
