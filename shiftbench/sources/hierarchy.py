"""Class hierarchies: the ImageNet/WordNet "is-a" graph and its calibrated variants.

A :class:`Hierarchy` is a rooted directed acyclic graph of node ids (WordNet ids such as
``n02084071`` or inserted ``dummyN`` nodes) with a display name per node. WordNet is a DAG;
BREEDS tasks need a tree over the dataset classes, which calibration provides
(see :mod:`shiftbench.sources.calibration`).

Levels follow the robustness library: the level of a node is the length of the *longest*
path from the root.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import networkx as nx
import polars as pl

from shiftbench.config.textio import read_text
from shiftbench.errors import InputError

ROOT_WNID = "n00001740"  # WordNet "entity"
_NODE_ID = re.compile(r"^[A-Za-z0-9_.:-]+$")


@dataclass(frozen=True)
class Hierarchy:
    """A rooted DAG with names; immutable so it can be cached and hashed safely."""

    edges: tuple[tuple[str, str], ...]
    names: Mapping[str, str] = field(hash=False)
    root: str = ROOT_WNID

    @classmethod
    def from_edges(cls, edges: Iterable[tuple[str, str]], names: Mapping[str, str], root: str = ROOT_WNID) -> Hierarchy:
        return cls(tuple(sorted(set(edges))), dict(names), root)

    @cached_property
    def graph(self) -> nx.DiGraph[str]:
        graph: nx.DiGraph[str] = nx.DiGraph()
        graph.add_edges_from(self.edges)
        return graph

    @property
    def nodes(self) -> list[str]:
        return sorted(self.graph.nodes)

    def name(self, node: str) -> str:
        return self.names.get(node, node)

    def children(self, node: str) -> list[str]:
        return sorted(self.graph.successors(node))

    def parents(self, node: str) -> list[str]:
        return sorted(self.graph.predecessors(node))

    def validate(self, dataset_classes: Iterable[str] = (), *, source: str = "hierarchy") -> None:
        """Raise :class:`InputError` unless rooted, acyclic, and every dataset class reachable."""
        graph = self.graph
        if self.root not in graph:
            raise InputError(f"root {self.root} is missing from the hierarchy", path=source)
        if graph.in_degree(self.root) != 0:
            raise InputError(f"root {self.root} has a parent", path=source)
        if not nx.is_directed_acyclic_graph(graph):
            cycle = nx.find_cycle(graph)
            shown = " -> ".join(edge[0] for edge in cycle) + f" -> {cycle[0][0]}"
            raise InputError(f"the hierarchy has a cycle: {shown}", path=source)
        reachable = nx.descendants(graph, self.root) | {self.root}
        unreachable = sorted(set(graph.nodes) - reachable)
        if unreachable:
            raise InputError(
                f"{len(unreachable)} node(s) not reachable from root {self.root}, e.g. {', '.join(unreachable[:5])}",
                path=source,
            )
        missing = sorted(set(dataset_classes) - reachable)
        if missing:
            raise InputError(
                f"{len(missing)} dataset class(es) not reachable from root {self.root}, e.g. {', '.join(missing[:5])}",
                path=source,
            )

    def restrict_to_ancestors(self, classes: Iterable[str]) -> Hierarchy:
        """The sub-hierarchy of nodes that are ancestors of (or equal to) a dataset class."""
        graph = self.graph
        keep: set[str] = set()
        stack = [cls for cls in classes if cls in graph]
        while stack:  # one walk up from all classes at once: linear in the ancestors, not in classes x depth
            node = stack.pop()
            if node not in keep:
                keep.add(node)
                stack.extend(graph.predecessors(node))
        edges = [(p, c) for p, c in self.edges if p in keep and c in keep]
        names = {n: self.names[n] for n in keep if n in self.names}
        return Hierarchy.from_edges(edges, names, self.root)

    @cached_property
    def levels(self) -> dict[str, int]:
        """Longest-path depth of every node reachable from the root."""
        graph = self.graph
        if self.root not in graph:
            return {}
        level = {self.root: 0}
        for node in nx.topological_sort(graph):
            if node not in level:
                continue
            for child in graph.successors(node):
                level[child] = max(level.get(child, 0), level[node] + 1)
        return level

    def descendants(self, node: str) -> set[str]:
        return set(nx.descendants(self.graph, node))

    def reachable_classes(self, node: str, classes: frozenset[str]) -> list[str]:
        """Sorted dataset classes at or below ``node`` (a dataset class counts itself)."""
        found = {n for n in self.descendants(node) if n in classes}
        if node in classes:
            found.add(node)
        return sorted(found)

    def is_tree(self) -> bool:
        return all(degree <= 1 for _, degree in self.graph.in_degree())

    def edges_table(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"parent": [p for p, _ in self.edges], "child": [c for _, c in self.edges]},
            schema={"parent": pl.String, "child": pl.String},
        )

    def nodes_table(self) -> pl.DataFrame:
        nodes = sorted(set(self.graph.nodes) | set(self.names))
        return pl.DataFrame(
            {"node": nodes, "name": [self.names.get(n, n) for n in nodes]},
            schema={"node": pl.String, "name": pl.String},
        )

    @classmethod
    def from_tables(cls, edges: pl.DataFrame, nodes: pl.DataFrame, root: str = ROOT_WNID) -> Hierarchy:
        return cls.from_edges(
            zip(edges["parent"].to_list(), edges["child"].to_list(), strict=True),
            dict(zip(nodes["node"].to_list(), nodes["name"].to_list(), strict=True)),
            root,
        )


def _check_id(token: str, path: Path, line_no: int) -> str:
    if not _NODE_ID.match(token):
        raise InputError(f"malformed node id {token!r}", path=path, line=line_no)
    return token


def read_edge_file(path: Path, names: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Parse ``parent child`` lines (ImageNet ``wordnet.is_a.txt``, BREEDS ``class_hierarchy.txt``).

    With ``names``, every id must be named there: catches typos in hand-edited files.
    """
    edges: list[tuple[str, str]] = []
    lines: dict[tuple[str, str], int] = {}
    text = read_text(path)
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(
                f"expected 'parent child', got {len(parts)} field(s): {line.strip()[:80]!r}",
                path=path,
                line=line_no,
            )
        for token in parts:
            _check_id(token, path, line_no)
            if names is not None and token not in names:
                raise InputError(f"unknown id {token} (not in the names file)", path=path, line=line_no)
        edges.append((parts[0], parts[1]))
        lines.setdefault((parts[0], parts[1]), line_no)
    if not edges:
        raise InputError("no edges", path=path)
    graph = nx.DiGraph(edges)
    if not nx.is_directed_acyclic_graph(graph):  # name the file and the line that closes a cycle
        cycle = nx.find_cycle(graph)
        shown = " -> ".join(edge[0] for edge in cycle) + f" -> {cycle[0][0]}"
        line_no = max(lines[(edge[0], edge[1])] for edge in cycle)
        raise InputError(f"the hierarchy has a cycle: {shown}", path=path, line=line_no)
    return edges


def read_names_file(path: Path) -> dict[str, str]:
    """Parse ``id<TAB>name`` lines (ImageNet ``words.txt``, BREEDS ``node_names.txt``)."""
    names: dict[str, str] = {}
    text = read_text(path)
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        node, sep, name = line.partition("\t")
        if not sep:
            raise InputError("expected 'id<TAB>name'", path=path, line=line_no)
        node = _check_id(node.strip(), path, line_no)
        if node in names:
            raise InputError(f"duplicate id {node}", path=path, line=line_no)
        names[node] = name.strip()
    return names
