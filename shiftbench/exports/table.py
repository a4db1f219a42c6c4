"""What every layout exports: the split's examples with their metadata fields, labels and image files.

Read and checked once, before any layout decides anything: every image exists (:func:`image_paths`), the
labels are ``0..K-1`` with one name each (ImageFolder's class indices, WILDS' ``y`` map and HF's
``ClassLabel`` all number classes that way), and each example has a file name of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError
from shiftbench.runtime.outputs import path_component
from shiftbench.scoring.grouper import metadata_table
from shiftbench.splits.images import ImageSource, image_paths
from shiftbench.splits.published import PublishedSplit

# Columns of every export's rows that are not metadata fields.
IDENTITY = ("example_id", "split", "y", "y_name")


@dataclass(frozen=True)
class ExportTable:
    """The split's rows (sorted by example id) with ``source`` (the image's path) and ``file`` (its file name in
    the export, unique), the class names by label, and the metadata fields (``group`` first)."""

    split: PublishedSplit
    rows: pl.DataFrame
    classes: tuple[str, ...]
    fields: tuple[str, ...]
    image_kind: str

    @property
    def splits(self) -> list[str]:
        return sorted(self.rows["split"].unique().to_list())

    def class_name(self, y: int) -> str:
        return f"{y} ({self.classes[y]})"


@dataclass(frozen=True)
class Plan:
    """A layout's export, decided and checked before anything is written: the images to place
    (``(source, path under DIR)``), the number of images per split or environment, and the layout's own files."""

    files: list[tuple[str, str]]
    counts: dict[str, int]
    write: Callable[[Path], None] = field(default=lambda folder: None)


def load_table(split: PublishedSplit, images: ImageSource) -> ExportTable:
    """The rows every layout reads; fails (one line) on a missing image or labels that are not ``0..K-1``."""
    rows = _with_metadata(split)
    sources = image_paths(rows["example_id"].to_list(), images.root, images.template)
    classes = _classes(split, rows)
    names = file_names(rows["example_id"].to_list(), [p.suffix for p in sources])
    rows = rows.with_columns(
        pl.Series("source", [str(p) for p in sources], dtype=pl.String), pl.Series("file", names, dtype=pl.String)
    )
    fields = tuple(c for c in rows.columns if c not in (*IDENTITY, "source", "file"))
    return ExportTable(split, rows, classes, fields, images.kind)


def _with_metadata(split: PublishedSplit) -> pl.DataFrame:
    """The examples with their metadata fields (the family's :func:`metadata_table`: one column per field)."""
    rows = split.examples.sort("example_id")
    extra = split.path / f"{metadata_table(split.family)}.parquet"
    if extra.is_file():
        attributes = pl.read_parquet(extra).drop("benchmark", "version", "split", "y", "y_name", strict=False)
        rows = rows.join(attributes, on="example_id", how="left")
    return rows


def _classes(split: PublishedSplit, rows: pl.DataFrame) -> tuple[str, ...]:
    pairs = rows.select("y", "y_name").unique().sort("y")
    labels = pairs["y"].to_list()
    if labels != list(range(len(labels))) or pairs["y"].n_unique() != pairs.height:
        raise InputError(
            f"{split.benchmark} {split.version}: labels must be 0..K-1 with one name each to export "
            f"(found {labels[:8]}{' ...' if len(labels) > 8 else ''})",
            parameter="benchmark",
        )
    return tuple(str(name) for name in pairs["y_name"].to_list())


def file_names(example_ids: list[str], suffixes: list[str]) -> list[str]:
    """One file name per example: its id as one path component (``/`` -> ``__``; BREEDS ids are paths) ending in
    its image's suffix; names that would coincide (also ignoring case) get a short hash of the id."""
    names = []
    for example_id, suffix in zip(example_ids, suffixes, strict=True):
        name = path_component(example_id.replace("/", "__"))
        names.append(name if name.lower().endswith(suffix.lower()) else name + suffix)
    counts: dict[str, int] = {}
    for name in names:
        counts[name.casefold()] = counts.get(name.casefold(), 0) + 1
    return [
        _hashed(name, example_id) if counts[name.casefold()] > 1 else name
        for name, example_id in zip(names, example_ids, strict=True)
    ]


def _hashed(name: str, key: str) -> str:
    path = Path(name)
    return f"{path.stem}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:8]}{path.suffix}"
