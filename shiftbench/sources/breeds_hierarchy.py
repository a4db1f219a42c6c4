"""The BREEDS calibrated ImageNet hierarchy (BREEDS-Benchmarks, MIT).

Files: ``class_hierarchy.txt`` (``parent child`` edges, with inserted ``dummyN`` nodes),
``node_names.txt`` (``id<TAB>name``) and ``dataset_class_info.json`` (``[index, wnid, name]``
for the 1000 classes), read from ``SHIFTBENCH_BREEDS_HIERARCHY_DIR``. Without it the same
hierarchy comes from WordNet and the shipped edit file (:mod:`shiftbench.breeds.calibrated`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shiftbench.config.textio import read_text
from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import Hierarchy, read_edge_file, read_names_file
from shiftbench.sources.imagenet import imagenet_classes
from shiftbench.tables.fingerprint import sha256_file, sha256_files

BREEDS_FILES = ("class_hierarchy.txt", "node_names.txt", "dataset_class_info.json")
# The files of the BREEDS-Benchmarks release (imagenet_class_hierarchy/modified): only files with
# exactly these bytes may be called the published hierarchy.
RELEASE_SHA256 = {
    "class_hierarchy.txt": "039cfaddf9732855b93f7899ba4b5ba6d80f8dbe15cfaad566f575b6c8ce0216",
    "node_names.txt": "322af45711ed69a7b199f11225bd964c7dae71df3c586498bef2f7c9e031dedb",
    "dataset_class_info.json": "be90503d57a001f95e094a81dc4de90772bfc58546ca58061d6474799829afd0",
}


def release_bytes_differ(directory: Path) -> tuple[str, ...]:
    """The files of ``directory`` whose bytes are not the release's (missing files count)."""
    return tuple(
        n for n in BREEDS_FILES if not (directory / n).is_file() or sha256_file(directory / n) != RELEASE_SHA256[n]
    )


@dataclass(frozen=True)
class BreedsHierarchyFiles:
    hierarchy: Hierarchy
    dataset_classes: list[tuple[int, str, str]]
    fingerprint: str
    origin: str  # where it came from, recorded in benchmark params
    differs_from_release: tuple[str, ...] = ()  # files whose bytes are not the BREEDS release's

    @property
    def is_release(self) -> bool:
        return not self.differs_from_release


def read_dataset_class_info(path: Path) -> list[tuple[int, str, str]]:
    """``[index, wnid, name]`` per class: known ImageNet wnids, each once, indices unique."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg}, column {exc.colno})", path=path, line=exc.lineno) from None
    if not isinstance(data, list) or not data:
        raise InputError("expected a non-empty list of [index, wnid, name]", path=path)
    known = set(imagenet_classes()["wnid"].to_list())

    searched_from: dict[str, int] = {}

    def line_of(wnid: str) -> int | None:
        """The line of this entry's wnid (a repeated wnid: of its repetition)."""
        at = text.find(f'"{wnid}"', searched_from.get(wnid, 0))
        searched_from[wnid] = at + 1
        return text[:at].count("\n") + 1 if at >= 0 else None

    rows: list[tuple[int, str, str]] = []
    seen_wnids: set[str] = set()
    seen_indices: set[int] = set()
    for position, item in enumerate(data):
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], int)
            or isinstance(item[0], bool)
            or not isinstance(item[1], str)
            or not isinstance(item[2], str)
        ):
            raise InputError(f"entry {position} is not [index, wnid, name]: {str(item)[:80]}", path=path)
        index, wnid, name = item
        where = f"entry {position} ({wnid})"
        if wnid not in known:
            raise InputError(f"{where}: not an ImageNet-1k class", path=path, line=line_of(wnid))
        if wnid in seen_wnids:
            raise InputError(f"{where}: the class is listed twice", path=path, line=line_of(wnid))
        if index in seen_indices:
            raise InputError(f"{where}: index {index} is used twice", path=path, line=line_of(wnid))
        line_of(wnid)  # moves past this entry's wnid
        seen_wnids.add(wnid)
        seen_indices.add(index)
        rows.append((index, wnid, name))
    return rows


def read_breeds_hierarchy_dir(directory: Path, origin: str | None = None) -> BreedsHierarchyFiles:
    for name in BREEDS_FILES:
        if not (directory / name).is_file():
            raise InputError("required BREEDS hierarchy file is missing", path=directory / name)
    names = read_names_file(directory / "node_names.txt")
    edges = read_edge_file(directory / "class_hierarchy.txt", names)
    classes = read_dataset_class_info(directory / "dataset_class_info.json")
    hierarchy = Hierarchy.from_edges(edges, names)
    hierarchy.validate(source=str(directory / "class_hierarchy.txt"))
    return BreedsHierarchyFiles(
        hierarchy,
        classes,
        sha256_files([directory / n for n in BREEDS_FILES], root=directory),
        origin or f"dir:{directory}",
        release_bytes_differ(directory),
    )
