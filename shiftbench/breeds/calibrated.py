"""The calibrated hierarchy a BREEDS build uses, and where it came from.

Where it comes from (never pretending to be the published hierarchy when it is not):

1. the BREEDS release's files from ``SHIFTBENCH_BREEDS_HIERARCHY_DIR`` (kind ``breeds-published``;
   files in that format whose bytes differ from the release are kind ``breeds-files``);
2. by default, WordNet (its database files, or ImageNet's files from ``SHIFTBENCH_IMAGENET_HIERARCHY_DIR``)
   restricted to the ancestors of the 1000 classes, plus the shipped BREEDS calibration edits
   (``shiftbench/data/breeds_calibration.edits``); the result must be the release's hierarchy, node
   for node and name for name (:data:`RELEASE_CONTENT_SHA256`), else the build is refused. Kind
   ``breeds-published``: both routes give the same content fingerprint, hence the same versions;
3. on request (``SHIFTBENCH_BREEDS_HIERARCHY_SOURCE=wordnet-default``), WordNet turned into a tree
   by the project's own rule :func:`shiftbench.sources.calibration.tree_edits` (kind
   ``wordnet-default-calibration``).

A user's edit file (``SHIFTBENCH_BREEDS_CALIBRATION``) is applied on top of any of them (kind gets
``+edits``); for WordNet's default calibration the tree rule runs after it, so the result is always
a tree. Only kind ``breeds-published`` builds the papers' names (see :func:`name_tag`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.errors import InputError
from shiftbench.sources.breeds_hierarchy import BreedsHierarchyFiles
from shiftbench.sources.calibration import apply_edits, read_edit_file, tree_edits
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.tables.fingerprint import sha256_file, sha256_json

KIND_PUBLISHED = "breeds-published"
KIND_FILES = "breeds-files"  # the release's format, not its bytes
KIND_WORDNET = "wordnet-default-calibration"
# The content of the BREEDS release's hierarchy (edges, names of its nodes, the 1000 classes in
# index order) as :func:`content_sha256` hashes it; tests/test_package_data.py recomputes it.
RELEASE_CONTENT_SHA256 = "7ea893c4704020e54e6f4a4fb7229f19d33e140df3f542b9a911708886efb27f"
# What a benchmark name carries after ``@`` when its hierarchy is not the release's.
NAME_TAGS = {KIND_FILES: "breeds-files", KIND_WORDNET: "wordnet-default"}


def content_sha256(hierarchy: Hierarchy, classes: tuple[str, ...] | list[str]) -> str:
    """Fingerprint of what a BREEDS build reads from a hierarchy, whatever files it came from."""
    names = {node: hierarchy.name(node) for node in hierarchy.nodes}
    return sha256_json({"edges": [list(edge) for edge in hierarchy.edges], "names": names, "classes": list(classes)})


def name_tag(kind: str) -> str | None:
    """``None`` for the release's hierarchy, else what benchmark names say after ``@``."""
    base, _, edits = kind.partition("+")
    tag = NAME_TAGS.get(base)
    if edits:
        return f"{tag}-edits" if tag else "edits"
    return tag


@dataclass(frozen=True)
class CalibratedHierarchy:
    hierarchy: Hierarchy
    dataset_classes: tuple[str, ...]
    kind: str
    sources: dict[str, Any] = field(hash=False)  # kind + content fingerprints: goes into params
    origin: dict[str, Any] = field(hash=False, default_factory=dict)  # paths, reasons: manifest only

    @property
    def fingerprint(self) -> str:
        return sha256_json(self.sources)

    @property
    def classes_in_hierarchy(self) -> list[str]:
        graph = self.hierarchy.graph
        return [c for c in self.dataset_classes if c in graph]

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.hierarchy.edges_table().write_parquet(directory / "edges.parquet")
        self.hierarchy.nodes_table().write_parquet(directory / "nodes.parquet")
        meta = {
            "dataset_classes": list(self.dataset_classes),
            "kind": self.kind,
            "sources": self.sources,
            "origin": self.origin,
            "root": self.hierarchy.root,
        }
        (directory / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True), "utf-8")

    @classmethod
    def load(cls, directory: Path) -> CalibratedHierarchy:
        meta = json.loads((directory / "meta.json").read_text("utf-8"))
        hierarchy = Hierarchy.from_tables(
            pl.read_parquet(directory / "edges.parquet"),
            pl.read_parquet(directory / "nodes.parquet"),
            meta["root"],
        )
        return cls(hierarchy, tuple(meta["dataset_classes"]), meta["kind"], meta["sources"], meta["origin"])


def _apply_user_edits(hierarchy: Hierarchy, edit_file: Path | None) -> tuple[Hierarchy, dict[str, str]]:
    if edit_file is None:
        return hierarchy, {}
    edits = read_edit_file(edit_file)
    return apply_edits(hierarchy, edits, str(edit_file)), {"edits_sha256": sha256_file(edit_file)}


def from_published(files: BreedsHierarchyFiles, edit_file: Path | None = None) -> CalibratedHierarchy:
    hierarchy, edit_sources = _apply_user_edits(files.hierarchy, edit_file)
    classes = tuple(wnid for _, wnid, _ in files.dataset_classes)
    hierarchy.validate(source=str(edit_file) if edit_file else files.origin)
    kind = (KIND_PUBLISHED if files.is_release else KIND_FILES) + ("+edits" if edit_sources else "")
    sources = {"hierarchy": kind, "hierarchy_sha256": content_sha256(files.hierarchy, classes), **edit_sources}
    origin = {
        "breeds_hierarchy": files.origin,
        **({"differs_from_release": list(files.differs_from_release)} if not files.is_release else {}),
        **({"edits": str(edit_file)} if edit_file else {}),
    }
    return CalibratedHierarchy(hierarchy, classes, kind, sources, origin)


def _missing_classes(wordnet: Hierarchy, classes: list[str]) -> None:
    unknown = sorted(set(classes) - set(wordnet.graph.nodes))
    if unknown:
        raise InputError(
            f"{len(unknown)} ImageNet class(es) missing from the WordNet hierarchy, e.g. {', '.join(unknown[:5])}",
            parameter="SHIFTBENCH_IMAGENET_HIERARCHY_DIR",
        )


def from_release_edits(
    wordnet: Hierarchy,
    wordnet_fingerprint: str,
    classes: list[str],
    release_edits: Path,
    edit_file: Path | None = None,
) -> CalibratedHierarchy:
    """WordNet + the shipped BREEDS calibration: the release's hierarchy, or a refusal saying why not."""
    _missing_classes(wordnet, classes)
    restricted = wordnet.restrict_to_ancestors(classes)
    try:
        release = apply_edits(restricted, read_edit_file(release_edits), str(release_edits))
    except InputError as exc:
        release = None
        reason = f"an edit does not fit ({exc})"
    else:
        reason = "the result is not the release's hierarchy"
    if release is None or content_sha256(release, classes) != RELEASE_CONTENT_SHA256:
        raise InputError(
            f"the shipped BREEDS calibration does not reproduce the BREEDS hierarchy on this WordNet: {reason}; "
            "set SHIFTBENCH_BREEDS_HIERARCHY_DIR to the release's files (imagenet_class_hierarchy/modified of "
            "BREEDS-Benchmarks), or SHIFTBENCH_BREEDS_HIERARCHY_SOURCE=wordnet-default for the project's own "
            "calibration (benchmarks named NAME@wordnet-default)",
            parameter="SHIFTBENCH_IMAGENET_HIERARCHY_DIR",
        )
    hierarchy, edit_sources = _apply_user_edits(release, edit_file)
    hierarchy.validate(source=str(edit_file) if edit_file else str(release_edits))
    kind = KIND_PUBLISHED + ("+edits" if edit_sources else "")
    sources = {"hierarchy": kind, "hierarchy_sha256": RELEASE_CONTENT_SHA256, **edit_sources}
    origin = {
        "breeds_hierarchy": f"package:{release_edits.name} over WordNet ({wordnet_fingerprint[:16]})",
        **({"edits": str(edit_file)} if edit_file else {}),
    }
    return CalibratedHierarchy(hierarchy, tuple(classes), kind, sources, origin)


def from_wordnet(
    wordnet: Hierarchy,
    wordnet_fingerprint: str,
    classes: list[str],
    edit_file: Path | None = None,
    fallback_reason: str = "",
) -> CalibratedHierarchy:
    _missing_classes(wordnet, classes)
    restricted = wordnet.restrict_to_ancestors(classes)
    edited, edit_sources = _apply_user_edits(restricted, edit_file)
    tree = apply_edits(edited, tree_edits(edited), "<default calibration: deepest parent>")
    tree.validate([c for c in classes if c in tree.graph], source=str(edit_file or "WordNet"))
    kind = KIND_WORDNET + ("+edits" if edit_sources else "")
    sources = {"hierarchy": kind, "wordnet_sha256": wordnet_fingerprint, **edit_sources}
    origin = {"fallback_reason": fallback_reason, **({"edits": str(edit_file)} if edit_file else {})}
    return CalibratedHierarchy(tree, tuple(classes), kind, sources, origin)
