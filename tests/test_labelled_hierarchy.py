"""Labelled hierarchies from CSV, Parquet and Open Images JSON files, the shipped CIFAR-100 grouping, and the
table of bad files: each one InputError naming the file and the line (Parquet: the row), nothing written."""

from __future__ import annotations

import fnmatch
import json
import random
import tomllib
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shiftbench.errors import InputError
from shiftbench.sources.labelled_hierarchy import (
    SHIPPED_HIERARCHIES,
    LabelledHierarchy,
    read_labelled_hierarchy,
    resolve_hierarchy,
)
from shiftbench.sources.packaged import DATA_DIR
from shiftbench.tables.fingerprint import sha256_file

from .conftest import PROJECT

SMALL_CSV = """parent,child,child_name
animal,dog,a dog
animal,cat,a cat
root,animal,animal kingdom
root,tool,
tool,"hammer, claw",claw hammer
"""

# Open Images' layout: 4-space indents, a node under two parents repeats its subtree, Part lists (part-of).
OPEN_IMAGES_JSON = """{
    "LabelName": "/m/root",
    "Subcategory": [
        {
            "LabelName": "/m/vehicle",
            "Subcategory": [
                {
                    "LabelName": "/m/car",
                    "Part": [
                        {
                            "LabelName": "/m/wheel",
                            "Subcategory": [
                                {
                                    "LabelName": "/m/tire"
                                }
                            ]
                        }
                    ]
                },
                {
                    "LabelName": "/m/amphibious"
                }
            ]
        },
        {
            "LabelName": "/m/boat",
            "Subcategory": [
                {
                    "LabelName": "/m/amphibious"
                }
            ]
        }
    ]
}
"""
OPEN_IMAGES_NAMES = '/m/vehicle,Vehicle\n/m/car,Car\n/m/boat,Boat\n/m/amphibious,"Amphibious vehicle, boat"\n'

# CIFAR-100's own label lists: the fine labels in the dataset's (alphabetical) order, the coarse labels in theirs,
# and the coarse label of each fine label as the dataset's label files pair them.
CIFAR100_FINE = [
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl", "boy",
    "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
    "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish",
    "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange",
    "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
    "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow_tree", "wolf", "woman", "worm"
]  # fmt: skip
CIFAR100_COARSE = [
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables", "household_electrical_devices",
    "household_furniture", "insects", "large_carnivores", "large_man-made_outdoor_things",
    "large_natural_outdoor_scenes", "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
    "people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2"
]  # fmt: skip
CIFAR100_COARSE_OF_FINE = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19,
    18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
]  # fmt: skip


def _write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif name.endswith(".parquet"):  # the same table as the CSV text, as Parquet
        pl.read_csv(text.encode(), infer_schema=False).write_parquet(path)
    else:
        path.write_text(text)
    return path


# ---- good input ----------------------------------------------------------------------------------------------


def test_a_small_csv_reads_with_its_root_classes_names_and_levels(tmp_path: Path) -> None:
    path = _write(tmp_path, "h.csv", SMALL_CSV)
    read = read_labelled_hierarchy(path)
    h = read.hierarchy
    assert h.root == "root"
    assert read.classes == ("cat", "dog", "hammer, claw")  # the leaves, sorted; a quoted id keeps its comma
    assert set(h.edges) == {
        ("root", "animal"), ("root", "tool"), ("animal", "dog"), ("animal", "cat"), ("tool", "hammer, claw")
    }  # fmt: skip
    assert h.name("dog") == "a dog" and h.name("animal") == "animal kingdom"
    assert h.name("tool") == "tool" and h.name("root") == "root"  # an empty name is no name: the id
    assert h.levels == {"root": 0, "animal": 1, "tool": 1, "dog": 2, "cat": 2, "hammer, claw": 2}
    assert (read.format, read.source, read.fingerprint) == ("csv", str(path), sha256_file(path))


def test_parquet_reads_the_same_hierarchy_as_the_csv(tmp_path: Path) -> None:
    from_csv = read_labelled_hierarchy(_write(tmp_path, "h.csv", SMALL_CSV))
    from_parquet = read_labelled_hierarchy(_write(tmp_path, "h.parquet", SMALL_CSV))
    assert from_parquet.hierarchy == from_csv.hierarchy
    assert dict(from_parquet.hierarchy.names) == dict(from_csv.hierarchy.names)
    assert from_parquet.classes == from_csv.classes
    assert from_parquet.format == "parquet"


def test_parquet_integer_ids_read_as_their_digits(tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    pl.DataFrame({"parent": [0, 0, 1], "child": [1, 2, 3]}).write_parquet(path)
    read = read_labelled_hierarchy(path)
    assert (read.hierarchy.root, read.classes) == ("0", ("2", "3"))


def test_csv_names_given_twice_alike_blank_lines_crlf_and_a_names_file(tmp_path: Path) -> None:
    text = "parent,child,child_name,parent_name\r\nr,a,Ay,Root\r\n\r\na,b,,Ay\r\n"
    path = _write(tmp_path, "h.csv", text)
    names = _write(tmp_path, "names.csv", "b,Bee\n\nr,Root\n")
    read = read_labelled_hierarchy(path, names=names)
    assert dict(read.hierarchy.names) == {"r": "Root", "a": "Ay", "b": "Bee"}
    assert read.fingerprint not in (sha256_file(path), sha256_file(names))  # both files count
    names.write_text("b,Bee!\n")
    assert read_labelled_hierarchy(path, names=names).fingerprint != read.fingerprint


def test_open_images_json_skips_part_lists_and_names_come_from_the_names_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "bbox_labels_600_hierarchy.json", OPEN_IMAGES_JSON)
    names = _write(tmp_path, "class-descriptions-boxable.csv", OPEN_IMAGES_NAMES)
    read = read_labelled_hierarchy(path, names=names, tree=False)
    h = read.hierarchy
    assert read.format == "openimages-json"
    assert h.root == "/m/root"
    assert set(h.edges) == {  # the repeated /m/amphibious gives two parents; the wheel and tire (Part) are gone
        ("/m/root", "/m/vehicle"), ("/m/root", "/m/boat"), ("/m/vehicle", "/m/car"),
        ("/m/vehicle", "/m/amphibious"), ("/m/boat", "/m/amphibious"),
    }  # fmt: skip
    assert read.classes == ("/m/amphibious", "/m/car")
    assert h.name("/m/amphibious") == "Amphibious vehicle, boat" and h.name("/m/root") == "/m/root"
    assert h.levels["/m/amphibious"] == 2
    # As a tree it is refused where the second parent lists it: line 29, the first parent's at line 21.
    with pytest.raises(InputError) as caught:
        read_labelled_hierarchy(path, names=names)
    assert (caught.value.path, caught.value.line) == (str(path), 29)
    assert "/m/amphibious has a second parent /m/boat; its first is /m/vehicle (line 21)" in str(caught.value)


def test_a_dag_reads_with_tree_false_and_levels_are_longest_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, "h.csv", "parent,child\nr,a\nr,b\na,c\nb,x\nc,x\n")
    read = read_labelled_hierarchy(path, tree=False)
    assert read.hierarchy.levels["x"] == 3  # r-a-c-x, not r-b-x
    assert read.classes == ("x",)
    assert not read.hierarchy.is_tree()


def test_the_shipped_cifar100_grouping_is_cifar100s_20_superclasses_of_5_classes() -> None:
    path = resolve_hierarchy("cifar100", None)
    assert path == SHIPPED_HIERARCHIES["cifar100"] == DATA_DIR / "cifar100_hierarchy.csv"
    read = read_labelled_hierarchy(path)
    h = read.hierarchy
    assert h.root == "cifar100"
    assert h.children("cifar100") == sorted(CIFAR100_COARSE)
    assert len(CIFAR100_FINE) == 100 and sorted(CIFAR100_FINE) == CIFAR100_FINE
    assert read.classes == tuple(CIFAR100_FINE)  # every fine label exactly once, as a leaf
    assert all(len(h.children(coarse)) == 5 for coarse in CIFAR100_COARSE)
    assert {h.parents(fine)[0] for fine in CIFAR100_FINE} == set(CIFAR100_COARSE)
    for fine, coarse in zip(CIFAR100_FINE, CIFAR100_COARSE_OF_FINE, strict=True):
        assert h.parents(fine) == [CIFAR100_COARSE[coarse]], fine
    assert set(h.levels.values()) == {0, 1, 2} and h.is_tree()
    assert h.name("aquatic_mammals") == "aquatic mammals" and h.name("maple_tree") == "maple tree"
    assert h.name("medium_mammals") == "medium-sized mammals" and h.name("sweet_pepper") == "sweet pepper"
    assert (DATA_DIR / "SOURCE-CIFAR100").read_text().startswith("cifar100_hierarchy.csv")


def test_every_shipped_data_file_is_in_the_package_data_globs() -> None:
    """An editable install reads the source tree; a wheel ships only what pyproject.toml's globs name."""
    globs = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["shiftbench"]
    shipped = [f"data/{p.name}" for p in DATA_DIR.iterdir() if p.is_file()]
    assert "data/cifar100_hierarchy.csv" in shipped and "data/SOURCE-CIFAR100" in shipped
    missing = [name for name in shipped if not any(fnmatch.fnmatch(name, g) for g in globs)]
    assert not missing


def test_resolve_hierarchy_reads_relative_paths_against_the_spec_folder(tmp_path: Path) -> None:
    path = _write(tmp_path, "mine.csv", SMALL_CSV)
    assert resolve_hierarchy("mine.csv", tmp_path) == path
    assert resolve_hierarchy(str(path), Path("/nowhere")) == path
    with pytest.raises(InputError) as caught:
        resolve_hierarchy("cifar-100", tmp_path)
    assert caught.value.parameter == "hierarchy"
    assert "unknown hierarchy 'cifar-100'" in str(caught.value) and "cifar100" in str(caught.value)


# ---- bad input -----------------------------------------------------------------------------------------------

CYCLE_JSON = """{
    "LabelName": "r",
    "Subcategory": [
        {
            "LabelName": "a",
            "Subcategory": [
                {"LabelName": "b", "Subcategory": [{"LabelName": "a"}]}
            ]
        }
    ]
}
"""
EMPTY_LEVEL_JSON = (
    '{\n  "LabelName": "r",\n  "Subcategory": [\n    {"LabelName": "a",\n     "Subcategory": []}\n  ]\n}\n'
)
TWICE_IN_ONE_LIST_JSON = '{"LabelName": "r",\n "Subcategory": [\n  {"LabelName": "a"},\n  {"LabelName": "a"}\n ]\n}\n'
CSV_TWO_PARENTS = "parent,child\nr,a\nr,b\na,x\nb,x\n"

# (case, {file name: text}, the file read, names file, expected text in the message, the file named, its line)
BAD_FILES = [
    ("cycle", {"h.csv": "parent,child\nr,a\na,b\nb,c\nc,a\n"}, "h.csv", None,
     "edge c -> a closes a cycle: a -> b -> c -> a", "h.csv", 5),
    ("cycle-json", {"h.json": CYCLE_JSON}, "h.json", None, "edge b -> a closes a cycle: a -> b -> a", "h.json", 7),
    ("two-parents", {"h.csv": CSV_TWO_PARENTS}, "h.csv", None,
     "x has a second parent b; its first is a (line 4)", "h.csv", 5),
    ("two-parents-parquet", {"h.parquet": CSV_TWO_PARENTS}, "h.parquet", None,
     "row 4: x has a second parent b; its first is a (row 3)", "h.parquet", None),
    ("names-unknown-id", {"h.csv": "parent,child\nr,a\n", "n.csv": "a,Ay\nzz,Zed\n"}, "h.csv", "n.csv",
     "unknown id zz: not a node of the hierarchy", "n.csv", 2),
    ("names-conflict", {"h.csv": "parent,child,child_name\nr,a,Ay\n", "n.csv": "r,R\na,Other\n"}, "h.csv", "n.csv",
     "a is named 'Other' here but 'Ay' at {tmp}/h.csv line 2", "n.csv", 2),
    ("names-without-name", {"h.csv": "parent,child\nr,a\n", "n.csv": "a\n"}, "h.csv", "n.csv",
     "1 field, expected 2", "n.csv", 1),
    ("names-empty-name", {"h.csv": "parent,child\nr,a\n", "n.csv": "r,R\na,\n"}, "h.csv", "n.csv",
     "no name for a", "n.csv", 2),
    ("name-given-twice", {"h.csv": "parent,child,child_name\nr,a,Ay\nr,b,Bee\nb,a,Ay2\n"}, "h.csv", None,
     "a is named 'Ay2' here but 'Ay' at line 2", "h.csv", 4),
    ("empty-level-json", {"h.json": EMPTY_LEVEL_JSON}, "h.json", None, "empty Subcategory list under a", "h.json", 5),
    ("empty-child", {"h.csv": "parent,child\nr,a\na,\n"}, "h.csv", None, "empty child id", "h.csv", 3),
    ("empty-parent", {"h.csv": 'parent,child\nr,a\n"  ",b\n'}, "h.csv", None, "empty parent id", "h.csv", 3),
    ("empty-parent-parquet", {"h.parquet": "parent,child\nr,a\n,b\n"}, "h.parquet", None,
     "row 2: empty parent id", "h.parquet", None),
    ("several-tops", {"h.csv": "parent,child\nr,a\ns,b\nt,c\n"}, "h.csv", None,
     "3 top nodes (r, s, t): a hierarchy needs a single root; add a root node", "h.csv", 3),
    ("self-loop", {"h.csv": "parent,child\nr,a\na,a\n"}, "h.csv", None, "self-loop: a is its own parent", "h.csv", 3),
    ("duplicate-edge", {"h.csv": "parent,child\nr,a\na,b\nr,a\n"}, "h.csv", None,
     "duplicate edge r -> a (first at line 2)", "h.csv", 4),
    ("twice-in-one-json-list", {"h.json": TWICE_IN_ONE_LIST_JSON}, "h.json", None,
     "a is listed twice under r (first at line 3)", "h.json", 4),
    ("missing-column", {"h.csv": "parent,kid\nr,a\n"}, "h.csv", None,
     "no 'child' column (have parent, kid;", "h.csv", 1),
    ("unexpected-column", {"h.csv": "parent,child,child_nam\nr,a,A\n"}, "h.csv", None,
     "unexpected column 'child_nam'", "h.csv", 1),
    ("header-only", {"h.csv": "parent,child,child_name\n"}, "h.csv", None, "no edges: only a header", "h.csv", 1),
    ("empty-csv", {"h.csv": ""}, "h.csv", None, "the file is empty", "h.csv", None),
    ("ragged-row", {"h.csv": "parent,child\nr,a\na,b,c,d\n"}, "h.csv", None, "4 fields, expected 2", "h.csv", 3),
    ("line-break-in-id", {"h.csv": 'parent,child\nr,a\na,"b\nc"\n'}, "h.csv", None,
     "child id 'b\\nc' has a line break", "h.csv", 3),
    ("malformed-json", {"h.json": '{\n  "LabelName": "r",\n  "Subcategory": [\n}\n'}, "h.json", None,
     "malformed JSON", "h.json", 4),
    ("json-top-array", {"h.json": '[{"LabelName": "r"}]\n'}, "h.json", None, "expected an object", "h.json", 1),
    ("json-no-labelname", {"h.json": '{"LabelName": "r", "Subcategory": [\n {\n  "Label": "a"}]}\n'}, "h.json", None,
     "an object without LabelName under r", "h.json", 3),
    ("json-unexpected-key", {"h.json": '{"LabelName": "r",\n "Subcategories": []}\n'}, "h.json", None,
     "unexpected key 'Subcategories'", "h.json", 2),
    ("json-lone-root", {"h.json": '{\n "LabelName": "r"\n}\n'}, "h.json", None, "no edges", "h.json", 2),
    ("not-found", {}, "missing.csv", None, "hierarchy file not found", "missing.csv", None),
    ("not-found-parquet", {}, "missing.parquet", None, "hierarchy file not found", "missing.parquet", None),
    ("names-not-found", {"h.csv": "parent,child\nr,a\n"}, "h.csv", "gone.csv",
     "names file not found", "gone.csv", None),
    ("unknown-extension", {"h.txt": "r a\n"}, "h.txt", None, "unknown hierarchy format '.txt'", "h.txt", None),
    ("not-utf8", {"h.csv": b"parent,child\nr,a\na,\xff\n"}, "h.csv", None, "not UTF-8", "h.csv", 3),
]  # fmt: skip


@pytest.mark.parametrize(
    ("files", "read", "names", "expected", "named", "line"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_FILES],
)
def test_bad_files_give_one_line_naming_the_file_and_line(
    tmp_path: Path,
    files: dict[str, str | bytes],
    read: str,
    names: str | None,
    expected: str,
    named: str,
    line: int | None,
) -> None:
    for name, text in files.items():
        _write(tmp_path, name, text)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError) as caught:
        read_labelled_hierarchy(tmp_path / read, names=tmp_path / names if names else None)
    error = caught.value
    assert expected.replace("{tmp}", str(tmp_path)) in str(error)
    assert (error.path, error.line) == (str(tmp_path / named), line)
    assert "\n" not in str(error).replace("\\n", "")  # one line
    assert str(error).startswith(f"{tmp_path / named}{'' if line is None else f':{line}'}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_two_parent_file_reads_as_a_dag(tmp_path: Path) -> None:
    read = read_labelled_hierarchy(_write(tmp_path, "h.csv", CSV_TWO_PARENTS), tree=False)
    assert read.hierarchy.parents("x") == ["a", "b"] and read.classes == ("x",)


def test_a_parquet_column_of_floats_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    pl.DataFrame({"parent": ["r"], "child": [1.5]}).write_parquet(path)
    with pytest.raises(InputError, match=r"column 'child' must hold strings \(or integer ids\), found Float64"):
        read_labelled_hierarchy(path)


# ---- round trips ---------------------------------------------------------------------------------------------


@st.composite
def _trees(draw: st.DrawFn) -> list[tuple[str, str]]:
    """A random rooted tree: node k > 0 hangs under a node before it; ids are words, some with commas."""
    count = draw(st.integers(2, 40))
    alphabet = st.sampled_from("abcxyz_ -,/")
    words = draw(st.lists(st.text(alphabet, min_size=1, max_size=6), min_size=count, max_size=count, unique=True))
    ids = [f"n{k}{word}".strip() for k, word in enumerate(words)]  # distinct by their prefix, none blank
    parents = [draw(st.integers(0, k - 1)) for k in range(1, count)]
    return [(ids[p], ids[k]) for k, p in enumerate(parents, start=1)]


def _as_open_images(edges: list[tuple[str, str]]) -> str:
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)

    def node(label: str) -> dict[str, object]:
        below = children.get(label, [])
        return {"LabelName": label, **({"Subcategory": [node(c) for c in below]} if below else {})}

    return json.dumps(node(edges[0][0]), indent=4)


@settings(max_examples=60, deadline=None)
@given(edges=_trees(), shuffle=st.randoms(use_true_random=False))
def test_any_tree_written_as_csv_parquet_or_json_reads_back_to_its_edges(
    tmp_path_factory: pytest.TempPathFactory, edges: list[tuple[str, str]], shuffle: random.Random
) -> None:
    folder = tmp_path_factory.mktemp("tree")
    rows = list(edges)
    shuffle.shuffle(rows)
    frame = pl.DataFrame({"parent": [p for p, _ in rows], "child": [c for _, c in rows]})
    frame.write_csv(folder / "t.csv")
    frame.write_parquet(folder / "t.parquet")
    (folder / "t.json").write_text(_as_open_images(edges))
    read: list[LabelledHierarchy] = [read_labelled_hierarchy(folder / f"t.{ext}") for ext in ("csv", "parquet", "json")]
    leaves = tuple(sorted({c for _, c in edges} - {p for p, _ in edges}))
    for one in read:
        assert one.hierarchy.edges == tuple(sorted(edges))
        assert one.hierarchy.root == edges[0][0]
        assert one.classes == leaves


@settings(max_examples=40, deadline=None)
@given(edges=_trees(), data=st.data())
def test_json_errors_name_the_line_of_the_offending_label(
    tmp_path_factory: pytest.TempPathFactory, edges: list[tuple[str, str]], data: st.DataObject
) -> None:
    """A random node given a second parent: the error names the line where the repeated LabelName was written."""
    nodes = [edges[0][0], *(c for _, c in edges)]
    child = data.draw(st.sampled_from(nodes[1:]))
    parent_of = {c: p for p, c in edges}
    others = [n for n in nodes if n not in (child, parent_of[child]) and n != nodes[0]]
    others = [n for n in others if child not in _ancestors(n, parent_of)]
    if not others:
        return
    second = data.draw(st.sampled_from(others))
    text = _as_open_images([*edges, (second, child)])
    path = tmp_path_factory.mktemp("json") / "t.json"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        read_labelled_hierarchy(path)
    assert caught.value.line is not None
    written = text.splitlines()[caught.value.line - 1]
    assert written.strip() == f'"LabelName": {json.dumps(child)}' or written.strip().startswith(
        f'"LabelName": {json.dumps(child)},'
    )
    assert "has a second parent" in str(caught.value)


def _ancestors(node: str, parent_of: dict[str, str]) -> set[str]:
    found: set[str] = set()
    while node in parent_of:
        node = parent_of[node]
        found.add(node)
    return found
