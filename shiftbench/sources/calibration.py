"""Hierarchy calibration: BREEDS' edit operations as a declarative edit file, and their diff.

BREEDS (Santurkar et al., Appendix A.4) calibrates WordNet for visual recognition with four
operations: *collapse node* (delete it, link each parent to each child), *insert node above*
(a dummy parent pushes a node one level down), *delete node* (with all its edges) and
*add edge*. :func:`diff` also needs *remove edge* and *rename node* to reach any target, e.g.
the published BREEDS hierarchy, which renames five WordNet nodes, and *add node* for a new
leaf (which no other operation can create).

Edit files are plain text, one operation per line, ``#`` comments::

    collapse_node      n03051540
    insert_node_above  n04230808 dummy32 garment
    delete_node        n00002684
    add_edge           n00021939 n03051540
    remove_edge        n00021939 n03051540
    rename_node        n03051540 apparel, toiletries
    add_node           n03051540 dummy99 a new leaf

The project's own default calibration of WordNet, :func:`tree_edits`, keeps for every node
with several parents only the parent deepest in the hierarchy (longest path from the root;
ties go to the smallest id). Levels are longest-path depths, so this keeps every node's level
and turns the DAG into a tree, in which no dataset class can fall under two superclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from shiftbench.config.textio import read_text
from shiftbench.errors import InputError, shown
from shiftbench.sources.hierarchy import Hierarchy

OPS: dict[str, tuple[int, bool]] = {
    # op name -> (number of node ids, whether a free-text name follows)
    "collapse_node": (1, False),
    "insert_node_above": (2, True),
    "delete_node": (1, False),
    "add_edge": (2, False),
    "remove_edge": (2, False),
    "rename_node": (1, True),
    "add_node": (2, True),  # add_node PARENT NEW [NAME]: a new leaf, which insert_node_above cannot make
}


@dataclass(frozen=True)
class Edit:
    op: str
    nodes: tuple[str, ...]
    name: str = ""
    line: int | None = None  # where it came from, for error messages

    def to_line(self) -> str:
        text = f"{self.op} {' '.join(self.nodes)}"
        return f"{text} {self.name}" if self.name else text


def parse_edits(text: str, source: str = "<edits>") -> list[Edit]:
    edits: list[Edit] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        op, *rest = line.split()
        if op not in OPS:
            raise InputError(f"unknown operation {op!r}; expected one of {', '.join(OPS)}", path=source, line=line_no)
        n_ids, has_name = OPS[op]
        if len(rest) < n_ids or (not has_name and len(rest) != n_ids):
            usage = f"{op} " + " ".join(f"ID{i + 1}" for i in range(n_ids)) + (" [NAME]" if has_name else "")
            raise InputError(f"expected '{usage}', got {shown(line)}", path=source, line=line_no)
        name = " ".join(rest[n_ids:]) if has_name else ""
        if op == "rename_node" and not name:
            raise InputError("rename_node needs a name", path=source, line=line_no)
        edits.append(Edit(op, tuple(rest[:n_ids]), name, line_no))
    return edits


def read_edit_file(path: Path) -> list[Edit]:
    return parse_edits(read_text(path, what="edit file", parameter="SHIFTBENCH_BREEDS_CALIBRATION"), str(path))


def format_edits(edits: Iterable[Edit]) -> str:
    return "".join(edit.to_line() + "\n" for edit in edits)


def apply_edits(hierarchy: Hierarchy, edits: Sequence[Edit], source: str = "<edits>") -> Hierarchy:
    """Apply edits in order; any edit that does not fit the current graph is an error."""
    graph: nx.DiGraph[str] = hierarchy.graph.copy()
    names = dict(hierarchy.names)

    def fail(edit: Edit, message: str) -> InputError:
        return InputError(f"{edit.to_line()!r}: {message}", path=source, line=edit.line)

    def need(edit: Edit, node: str) -> None:
        if node not in graph:
            raise fail(edit, f"unknown node {node}")

    for edit in edits:
        if edit.op == "collapse_node":
            (node,) = edit.nodes
            need(edit, node)
            if node == hierarchy.root:
                raise fail(edit, "cannot collapse the root")
            parents, children = list(graph.predecessors(node)), list(graph.successors(node))
            graph.remove_node(node)
            graph.add_edges_from((p, c) for p in parents for c in children)
        elif edit.op == "insert_node_above":
            node, new = edit.nodes
            need(edit, node)
            if new in graph:
                raise fail(edit, f"node {new} already exists")
            if node == hierarchy.root:
                raise fail(edit, "cannot insert above the root")
            parents = list(graph.predecessors(node))
            graph.remove_edges_from((p, node) for p in parents)
            graph.add_edges_from((p, new) for p in parents)
            graph.add_edge(new, node)
            names[new] = edit.name or new
        elif edit.op == "delete_node":
            (node,) = edit.nodes
            need(edit, node)
            if node == hierarchy.root:
                raise fail(edit, "cannot delete the root")
            graph.remove_node(node)
        elif edit.op == "add_edge":
            parent, child = edit.nodes
            need(edit, parent)
            need(edit, child)
            if graph.has_edge(parent, child):
                raise fail(edit, "edge already exists")
            graph.add_edge(parent, child)
        elif edit.op == "remove_edge":
            parent, child = edit.nodes
            if not graph.has_edge(parent, child):
                raise fail(edit, "no such edge")
            graph.remove_edge(parent, child)
        elif edit.op == "add_node":
            parent, new = edit.nodes
            need(edit, parent)
            if new in graph:
                raise fail(edit, f"node {new} already exists")
            graph.add_edge(parent, new)
            names[new] = edit.name or new
        elif edit.op == "rename_node":
            (node,) = edit.nodes
            need(edit, node)
            names[node] = edit.name
        else:  # parse_edits only creates known ops; a hand-built Edit may not
            raise fail(edit, "unknown operation")
    kept = {n: names.get(n, n) for n in graph.nodes}
    return Hierarchy.from_edges(graph.edges, kept, hierarchy.root)


def diff(source: Hierarchy, target: Hierarchy) -> list[Edit]:
    """Edits that turn ``source`` into ``target`` (same edges, same names) under :func:`apply_edits`.

    Removed nodes are collapsed when that creates at least one edge the target has (the
    structure-preserving choice BREEDS made), else deleted; new nodes are inserted above one
    of their target children, deepest first (new leaves are added under the root); remaining
    edge and name differences become add/remove edge and rename edits.
    """
    graph: nx.DiGraph[str] = source.graph.copy()
    names = {n: source.names.get(n, n) for n in graph.nodes}
    target_graph = target.graph
    target_edges = set(target.edges)
    edits: list[Edit] = []

    for node in sorted(set(graph.nodes) - set(target_graph.nodes)):
        parents, children = list(graph.predecessors(node)), list(graph.successors(node))
        bridged = [(p, c) for p in parents for c in children]
        if any(edge in target_edges for edge in bridged):
            edits.append(Edit("collapse_node", (node,)))
            graph.remove_node(node)
            graph.add_edges_from(bridged)
        else:
            edits.append(Edit("delete_node", (node,)))
            graph.remove_node(node)

    new_nodes = set(target_graph.nodes) - set(graph.nodes)
    levels = target.levels
    for node in sorted(new_nodes, key=lambda n: (-levels.get(n, 0), n)):
        children = sorted(c for c in target_graph.successors(node) if c in graph)
        name = target.names.get(node, node)
        if not children:  # a new leaf: attach under the root; the edge pass below moves it
            edits.append(Edit("add_node", (source.root, node), name))
            graph.add_edge(source.root, node)
            names[node] = name
            continue
        edits.append(Edit("insert_node_above", (children[0], node), name))
        parents = list(graph.predecessors(children[0]))
        graph.remove_edges_from((p, children[0]) for p in parents)
        graph.add_edges_from((p, node) for p in parents)
        graph.add_edge(node, children[0])
        names[node] = name

    current = set(graph.edges)
    edits.extend(Edit("remove_edge", edge) for edge in sorted(current - target_edges))
    edits.extend(Edit("add_edge", edge) for edge in sorted(target_edges - current))
    for node in sorted(target_graph.nodes):
        wanted = target.names.get(node, node)
        if names.get(node, node) != wanted:
            edits.append(Edit("rename_node", (node,), wanted))
    return edits


def tree_edits(hierarchy: Hierarchy) -> list[Edit]:
    """The default calibration: keep only the deepest parent of each node (ties: smallest id)."""
    levels = hierarchy.levels
    edits: list[Edit] = []
    for node in hierarchy.nodes:
        parents = hierarchy.parents(node)
        if len(parents) <= 1:
            continue
        keep = min(parents, key=lambda p: (-levels.get(p, -1), p))
        edits.extend(Edit("remove_edge", (p, node)) for p in parents if p != keep)
    return edits
