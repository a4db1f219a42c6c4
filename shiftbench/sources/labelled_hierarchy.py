"""Labelled class hierarchies read from a file, so BREEDS tasks can be built on any dataset whose classes
have a semantic grouping (CIFAR-100's superclasses, Open Images' label hierarchy, a user's own table).

Formats, chosen by the file's extension:

- ``.csv`` and ``.parquet``: one row per is-a edge, columns ``parent`` and ``child``, optionally
  ``child_name`` and ``parent_name`` (an empty name is no name; a node named twice must be named the same).
  Errors in a CSV name the file line (the header is line 1, the first edge line 2); in a Parquet file the
  row (the first row is row 1). Blank CSV lines are skipped.
- ``.json``: Open Images' hierarchy (``bbox_labels_600_hierarchy.json``): nested objects
  ``{"LabelName": id, "Subcategory": [...]}``; a node under several parents repeats its subtree under each.
  ``"Part"`` lists say part-of, not is-a (a wheel is part of a car, not a kind of car), so they are skipped
  with everything under them. Errors name the line of the offending key (``json`` gives no positions: the
  keys' lines come from a scan of the text's string tokens, in document order).
- names (``names=``, any format): ``id,name`` per line, no header: Open Images'
  ``class-descriptions-boxable.csv``. Every id there must be a node of the hierarchy (catches a names
  file of another release); nodes it does not name keep the name the hierarchy file gives, else their id.

The root is the file's single node without a parent; the dataset classes are the leaves. By default the
hierarchy must be a tree; ``tree=False`` reads a DAG (levels are then longest paths, as in
:class:`shiftbench.sources.hierarchy.Hierarchy`). Every problem is one :class:`InputError` naming the file and line.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import polars as pl

from shiftbench.config.textio import read_text
from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.sources.packaged import DATA_DIR
from shiftbench.tables.fingerprint import sha256_file

FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "openimages-json"}
SHIPPED_HIERARCHIES: dict[str, Path] = {"cifar100": DATA_DIR / "cifar100_hierarchy.csv"}
EDGE_COLUMNS = ("parent", "child")
NAME_COLUMNS = ("child_name", "parent_name")
CSV_FIRST_DATA_LINE = 2  # line 1 is the header
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a line break in a field would also shift every later line number
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"(\s*:)?')  # a string token, and the colon that makes it a key
_JSON_KEYS = ("LabelName", "Subcategory", "Part")
_LAYOUT = '{"LabelName": id, "Subcategory": [...]}'
_SHOWN = 10  # nodes listed in a message


@dataclass(frozen=True)
class LabelledHierarchy:
    hierarchy: Hierarchy  # root = the file's single top node; names from the file (or names file) or ids
    classes: tuple[str, ...]  # the dataset classes: the leaves (nodes without children), sorted
    fingerprint: str  # sha256 of the file bytes, combined with the names file's when one is given
    source: str  # the path as given (for messages and cards)
    format: str  # "csv" | "parquet" | "openimages-json"


@dataclass(frozen=True)
class _Places:
    """Positions in one file: file lines (CSV, JSON, names files) or table rows (Parquet)."""

    path: Path
    unit: str  # "line" | "row"

    def at(self, pos: int) -> str:
        return f"{self.unit} {pos}"

    def ref(self, pos: int, here: _Places) -> str:
        """``pos`` as seen from a message about ``here``: the file is named when it is another one."""
        return self.at(pos) if self.path == here.path else f"{self.path} {self.at(pos)}"

    def error(self, message: str, pos: int | None = None) -> InputError:
        if pos is None or self.unit == "line":
            return InputError(message, path=self.path, line=pos)
        return InputError(f"row {pos}: {message}", path=self.path)


@dataclass(frozen=True)
class _Edge:
    parent: str
    child: str
    pos: int  # line or row of the edge (JSON: the line of the child's LabelName)


@dataclass
class _Names:
    """Node names with where each was first given: a node named twice differently is an error."""

    given: dict[str, tuple[str, _Places, int]] = field(default_factory=dict)

    def add(self, node: str, name: str, places: _Places, pos: int) -> None:
        first = self.given.setdefault(node, (name, places, pos))
        if first[0] != name:
            where = first[1].ref(first[2], places)
            raise places.error(f"{node} is named {name!r} here but {first[0]!r} at {where}", pos)


def read_labelled_hierarchy(path: Path, *, names: Path | None = None, tree: bool = True) -> LabelledHierarchy:
    """Read and check a hierarchy file (and its names file); see the module docstring for the formats."""
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        suffix = path.suffix or "(no extension)"
        raise InputError(
            f"unknown hierarchy format {suffix!r}: expected .csv, .parquet or .json (Open Images)", path=path
        )
    given = _Names()
    edges = _read_json(path) if kind == "openimages-json" else _read_table(path, kind, given)
    root = _check_structure(edges, _Places(path, "row" if kind == "parquet" else "line"), tree)
    nodes = {root} | {e.child for e in edges}
    if names is not None:
        _add_names_file(names, nodes, path, given)
    named = {node: given.given[node][0] if node in given.given else node for node in nodes}
    hierarchy = Hierarchy.from_edges([(e.parent, e.child) for e in edges], named, root)
    leaves = tuple(sorted(nodes - {e.parent for e in edges}))
    return LabelledHierarchy(hierarchy, leaves, _fingerprint(path, names), str(path), kind)


def resolve_hierarchy(value: str, relative_to: Path | None) -> Path:
    """A shipped hierarchy's name (``cifar100``), else a path: a relative one is read against ``relative_to``
    (the spec file's folder). A shipped name wins over a file of the same name."""
    if value in SHIPPED_HIERARCHIES:
        return SHIPPED_HIERARCHIES[value]
    path = Path(value).expanduser()
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    if not value.strip() or not path.is_file():
        shipped = ", ".join(sorted(SHIPPED_HIERARCHIES))
        raise InputError(
            f"unknown hierarchy {value!r}: not a shipped one ({shipped}) and no such file ({path})",
            parameter="hierarchy",
        )
    return path


def _fingerprint(path: Path, names: Path | None) -> str:
    digest = sha256_file(path)
    if names is None:
        return digest
    return hashlib.sha256(f"hierarchy {digest}\nnames {sha256_file(names)}\n".encode()).hexdigest()


# ---- structure -----------------------------------------------------------------------------------------------


def _check_structure(edges: list[_Edge], places: _Places, tree: bool) -> str:
    """The root, once the edges are known to form a DAG (a tree with ``tree``) with a single top node."""
    if not edges:
        raise places.error("no edges: the hierarchy is empty")
    first: dict[tuple[str, str], int] = {}
    for edge in edges:
        if edge.parent == edge.child:
            raise places.error(f"self-loop: {edge.child} is its own parent", edge.pos)
        seen = first.setdefault((edge.parent, edge.child), edge.pos)
        if seen != edge.pos:
            raise places.error(f"duplicate edge {edge.parent} -> {edge.child} (first at {places.at(seen)})", edge.pos)
    _check_acyclic(edges, first, places)
    if tree:
        _check_one_parent(edges, places)
    return _single_root(edges, places)


def _check_acyclic(edges: list[_Edge], first: dict[tuple[str, str], int], places: _Places) -> None:
    """Name the edge that closes a cycle (the cycle's last edge in the file) and show the cycle."""
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_edges_from((e.parent, e.child) for e in edges)
    if nx.is_directed_acyclic_graph(graph):
        return
    cycle = [(str(u), str(v)) for u, v, *_ in nx.find_cycle(graph)]
    order = {(e.parent, e.child): index for index, e in enumerate(edges)}  # JSON puts several edges on a line
    closing = max(range(len(cycle)), key=lambda i: order[cycle[i]])
    ordered = cycle[closing + 1 :] + cycle[: closing + 1]  # ends with the closing edge
    shown = " -> ".join([ordered[0][0], *(v for _, v in ordered)])
    parent, child = cycle[closing]
    raise places.error(f"edge {parent} -> {child} closes a cycle: {shown}", first[cycle[closing]])


def _check_one_parent(edges: list[_Edge], places: _Places) -> None:
    parent_of: dict[str, tuple[str, int]] = {}
    for edge in edges:
        parent, pos = parent_of.setdefault(edge.child, (edge.parent, edge.pos))
        if parent != edge.parent:
            raise places.error(
                f"{edge.child} has a second parent {edge.parent}; its first is {parent} ({places.at(pos)}): "
                "a tree gives each node one parent (read it as a DAG to allow several)",
                edge.pos,
            )


def _single_root(edges: list[_Edge], places: _Places) -> str:
    children = {e.child for e in edges}
    tops: dict[str, int] = {}
    for edge in edges:
        if edge.parent not in children:
            tops.setdefault(edge.parent, edge.pos)
    if len(tops) == 1:
        return next(iter(tops))
    listed = list(tops)  # a DAG has at least one top node: cycles were refused before
    shown = ", ".join(listed[:_SHOWN]) + (f", ... ({len(listed)} in all)" if len(listed) > _SHOWN else "")
    raise places.error(
        f"{len(listed)} top nodes ({shown}): a hierarchy needs a single root; add a root node as the parent of each",
        tops[listed[1]],
    )


# ---- CSV and Parquet -----------------------------------------------------------------------------------------


def _read_table(path: Path, kind: str, names: _Names) -> list[_Edge]:
    if kind == "csv":
        frame = _read_csv(read_text(path, what="hierarchy file"), path, header=True)
        places, first = _Places(path, "line"), CSV_FIRST_DATA_LINE
    else:
        frame = _read_parquet(path)
        places, first = _Places(path, "row"), 1
    missing = [c for c in EDGE_COLUMNS if c not in frame.columns]
    unexpected = [c for c in frame.columns if c not in EDGE_COLUMNS + NAME_COLUMNS]
    header = 1 if kind == "csv" else None
    if missing or unexpected:
        problem = f"no {', '.join(map(repr, missing))} column" if missing else f"unexpected column {unexpected[0]!r}"
        raise places.error(
            f"{problem} (have {', '.join(frame.columns)}; expected parent, child and optionally "
            f"{' and '.join(NAME_COLUMNS)})",
            header,
        )
    return _table_edges(frame, places, first, names)


def _table_edges(frame: pl.DataFrame, places: _Places, first: int, names: _Names) -> list[_Edge]:
    edges: list[_Edge] = []
    skip_blank = places.unit == "line"  # a blank CSV line reads as a row of nulls
    for offset, row in enumerate(frame.iter_rows(named=True)):
        pos = first + offset
        if skip_blank and all(value is None for value in row.values()):
            continue
        parent = _node_id(row["parent"], "parent id", places, pos)
        child = _node_id(row["child"], "child id", places, pos)
        for node, column in ((child, "child_name"), (parent, "parent_name")):
            name = _name(row.get(column), column, places, pos)
            if name is not None:
                names.add(node, name, places, pos)
        edges.append(_Edge(parent, child, pos))
    if not edges:
        raise places.error("no edges: only a header", 1) if skip_blank else places.error("no edges: the table is empty")
    return edges


def _node_id(value: Any, what: str, places: _Places, pos: int) -> str:
    text = "" if value is None else str(value).strip()
    if not text:
        raise places.error(f"empty {what}", pos)
    if _CONTROL.search(text):
        raise places.error(f"{what} {text!r} has a line break or control character", pos)
    return text


def _name(value: Any, what: str, places: _Places, pos: int) -> str | None:
    text = "" if value is None else str(value).strip()
    if _CONTROL.search(text):
        raise places.error(f"{what} {text!r} has a line break or control character", pos)
    return text or None


def _read_parquet(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise InputError("hierarchy file not found" if not path.exists() else "not a file", path=path)
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(f"unreadable Parquet: {str(exc).splitlines()[0]}", path=path) from None
    for column, dtype in frame.schema.items():
        if not (dtype == pl.String or dtype == pl.Null or dtype.is_integer()):
            raise InputError(f"column {column!r} must hold strings (or integer ids), found {dtype}", path=path)
    return frame.with_columns(pl.all().cast(pl.String))


def _read_csv(text: str, path: Path, *, header: bool, columns: list[str] | None = None) -> pl.DataFrame:
    """Polars reads the CSV; when it refuses a row, the csv module finds the line to name."""
    try:
        return pl.read_csv(text.encode(), has_header=header, new_columns=columns, infer_schema=False)
    except pl.exceptions.NoDataError:
        raise InputError("the file is empty", path=path) from None
    except pl.exceptions.PolarsError as exc:
        line, fields, expected = _ragged_line(text, len(columns) if columns else None)
        if line is None:
            raise InputError(f"unreadable CSV: {str(exc).splitlines()[0]}", path=path) from None
        plural = "" if fields == 1 else "s"
        raise InputError(f"{fields} field{plural}, expected {expected}", path=path, line=line) from None


def _ragged_line(text: str, expected: int | None) -> tuple[int | None, int, int]:
    """(first line whose field count differs from the header's or ``expected``, its count, the expected)."""
    reader = csv.reader(io.StringIO(text))
    start = 1
    for record in reader:
        if record:
            expected = len(record) if expected is None else expected
            if len(record) != expected:
                return start, len(record), expected
        start = reader.line_num + 1
    return None, 0, expected or 0


# ---- names files ---------------------------------------------------------------------------------------------


def _add_names_file(path: Path, nodes: set[str], hierarchy_path: Path, names: _Names) -> None:
    """``id,name`` lines: every id must be a node, and agree with a name the hierarchy file gave."""
    frame = _read_csv(read_text(path, what="names file"), path, header=False, columns=["id", "name"])
    places = _Places(path, "line")
    for offset, (node_value, name_value) in enumerate(frame.iter_rows()):
        line = offset + 1
        if node_value is None and name_value is None:
            continue  # a blank line
        node = _node_id(node_value, "id", places, line)
        name = _name(name_value, "name", places, line)
        if name is None:
            raise places.error(f"no name for {node} (expected 'id,name')", line)
        if node not in nodes:
            raise places.error(f"unknown id {node}: not a node of the hierarchy {hierarchy_path}", line)
        names.add(node, name, places, line)


# ---- Open Images JSON ----------------------------------------------------------------------------------------


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in document order (repeated keys kept), told apart from arrays."""


@dataclass
class _JsonObject:
    """One ``{"LabelName": ..., "Subcategory": [...]}`` being walked: its keys are read in document order."""

    pairs: _Pairs
    label: str | None
    parent: str | None  # None for the top object and everything under a Part list
    siblings: dict[str, int]  # labels already in the list holding this object -> their lines
    in_part: bool
    next_pair: int = 0
    keys_seen: set[str] = field(default_factory=set)


@dataclass
class _JsonList:
    """A ``Subcategory`` or ``Part`` list being walked."""

    items: list[Any]
    owner: str | None
    key: str
    line: int  # of the key
    in_part: bool
    siblings: dict[str, int] = field(default_factory=dict)
    next_item: int = 0


def _read_json(path: Path) -> list[_Edge]:
    text = read_text(path, what="hierarchy file")
    places = _Places(path, "line")
    try:
        top = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno) from None
    except RecursionError:
        raise InputError("malformed JSON: nested too deeply", path=path) from None
    key_lines = _json_key_lines(text)
    if not isinstance(top, _Pairs):
        raise places.error(f"expected an object at the top (Open Images' layout: {_LAYOUT})", 1)
    return _JsonWalk(places, key_lines).run(top)


def _json_key_lines(text: str) -> list[int]:
    """The line of every object key, in document order (the order ``object_pairs_hook`` sees them)."""
    lines: list[int] = []
    line, scanned = 1, 0
    for match in _JSON_STRING.finditer(text):  # tokens whole, so a quote inside a string never starts one
        if match.group(1) is not None:
            line += text.count("\n", scanned, match.start())
            scanned = match.start()
            lines.append(line)
    return lines


@dataclass
class _JsonWalk:
    """Depth-first over the objects in document order, with an explicit stack (no recursion limit)."""

    places: _Places
    key_lines: list[int]
    edges: list[_Edge] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    next_key: int = 0

    def run(self, top: _Pairs) -> list[_Edge]:
        stack: list[_JsonObject | _JsonList] = [self._enter(top, None, {}, False, 1)]
        while stack:
            frame = stack[-1]
            if isinstance(frame, _JsonList):
                if frame.next_item == len(frame.items):
                    stack.pop()
                    continue
                item = frame.items[frame.next_item]
                frame.next_item += 1
                stack.append(self._enter(item, frame.owner, frame.siblings, frame.in_part, frame.line))
            elif frame.next_pair == len(frame.pairs):
                stack.pop()
            else:
                key, value = frame.pairs[frame.next_pair]
                frame.next_pair += 1
                listed = self._key(frame, key, value)
                if listed is not None:
                    stack.append(listed)
        if not self.edges:
            raise self.places.error("no edges: the top object has no Subcategory", self.key_lines[0])
        return self.edges

    def _line(self) -> int:
        if self.next_key >= len(self.key_lines):  # a key the scan missed: cannot happen in valid JSON
            raise RuntimeError("internal error: the JSON keys and their lines are out of step")
        self.next_key += 1
        return self.key_lines[self.next_key - 1]

    def _enter(self, item: Any, parent: str | None, siblings: dict[str, int], in_part: bool, line: int) -> _JsonObject:
        """An object of a list (or the top one): it must have a LabelName. ``line``: the list's key line."""
        if not isinstance(item, _Pairs):
            raise self.places.error(f"expected objects in the list, found {json.dumps(item)[:40]}", line)
        labels = [value for key, value in item if key == "LabelName"]
        if not labels:
            where = self.key_lines[self.next_key] if item and self.next_key < len(self.key_lines) else line
            problem = f"an object without LabelName under {parent}" if parent else "the top object has no LabelName"
            raise self.places.error(f"{problem} (Open Images' layout: {_LAYOUT})", where)
        label = labels[0].strip() if isinstance(labels[0], str) else None
        return _JsonObject(item, label, None if in_part else parent, siblings, in_part)

    def _key(self, frame: _JsonObject, key: str, value: Any) -> _JsonList | None:
        """Read one key of ``frame``; a list to walk next for Subcategory and Part."""
        line = self._line()
        if key in frame.keys_seen:
            raise self.places.error(f"{key} given twice in one object", line)
        frame.keys_seen.add(key)
        if key == "LabelName":
            self._label(frame, value, line)
            return None
        if key not in _JSON_KEYS:
            raise self.places.error(f"unexpected key {key!r} (expected {', '.join(_JSON_KEYS)})", line)
        if type(value) is not list or not all(isinstance(item, _Pairs) for item in value):
            raise self.places.error(f"{key} of {frame.label} must be a list of objects", line)
        if not value:
            raise self.places.error(f"empty {key} list under {frame.label}: drop it or list the children", line)
        return _JsonList(value, frame.label, key, line, frame.in_part or key == "Part")

    def _label(self, frame: _JsonObject, value: Any, line: int) -> None:
        """The object's LabelName: the edge from its parent, unless a repeated subtree already gave it."""
        if not isinstance(value, str):
            raise self.places.error(f"LabelName must be a string, found {json.dumps(value)[:40]}", line)
        label = _node_id(value, "LabelName", self.places, line)
        if label in frame.siblings:
            where = self.places.at(frame.siblings[label])
            raise self.places.error(f"{label} is listed twice under {frame.parent} (first at {where})", line)
        frame.siblings[label] = line
        if frame.parent is not None and (frame.parent, label) not in self.seen:
            self.seen.add((frame.parent, label))
            self.edges.append(_Edge(frame.parent, label, line))
