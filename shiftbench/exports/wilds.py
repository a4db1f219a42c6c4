"""WILDS' layout: what a ``WILDSDataset`` subclass sets, as files.

- ``metadata.csv``: one row per example: ``example_id``, ``path`` (under ``DIR``: ``images/<file>``),
  ``split`` (WILDS' integer code: ``_split_array``), ``y`` (``_y_array``), then one integer column per
  metadata field (``_metadata_array``, in ``metadata_fields`` order; ``y`` is the last field, as in WILDS'
  own datasets).
- ``wilds.json``: ``dataset_name``, ``version``, ``image_source`` (``standin`` for generated stand-ins),
  ``split_dict`` and ``split_names`` (the same keys, ``train`` and ``val`` always among them:
  ``WILDSDataset.check_init`` asserts both), ``metadata_fields``, ``metadata_map``
  (field -> the value each code stands for: code ``i`` is the ``i``-th value in sorted order, a missing value
  last as ``null``; ``y`` -> the class names), ``n_classes``, ``y_size``, ``split_sources`` (WILDS split ->
  shiftbench split, where they differ: ``val`` <- ``id_val``; see :mod:`shiftbench.exports.splits`) and
  ``empty_splits`` (``train`` or ``val`` declared for ``check_init`` though the split has no such examples:
  BREEDS without ImageNet's training images, a task without a validation split).
- ``images/<file>``: the images (``--images``).

``WILDSDataset.metadata_map`` is documented as the map from the integers in ``metadata_array`` to what they
mean, and ``CombinatorialGrouper`` numbers groups by those integers, so grouping the export by fields gives
the groups ``shiftbench eval --group-by`` and training form (the same partition of the examples).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError
from shiftbench.exports.splits import validation_split
from shiftbench.exports.table import ExportTable, Plan

# WILDS' split codes: train/val/test 0/1/2 (WILDSDataset.DEFAULT_SPLITS), id_val/id_test 3/4 as its datasets
# with ID splits number them; ood_train (BREEDS' target-domain training images) is 5 here.
WILDS_SPLITS = {"train": 0, "val": 1, "test": 2, "id_val": 3, "id_test": 4, "ood_train": 5}
SPLIT_NAMES = {
    "train": "Train",
    "val": "Validation (OOD)",
    "test": "Test (OOD)",
    "id_val": "Validation (ID)",
    "id_test": "Test (ID)",
    "ood_train": "Train (OOD)",
}
IMAGES = "images"
REQUIRED = ("train", "val")  # WILDSDataset.check_init asserts both keys


def wilds(table: ExportTable, val_split: str | None) -> Plan:
    """Plan the WILDS files (nothing written): split codes, metadata codes and maps."""
    benchmark = table.split.benchmark
    unknown = [s for s in table.splits if s not in WILDS_SPLITS]
    if unknown:
        raise InputError(f"{benchmark}: split {unknown[0]!r} has no WILDS code", parameter="--layout")
    validation = validation_split(benchmark, table.splits, val_split)
    wilds_name = {s: "val" if s == validation else s for s in table.splits}
    present = {wilds_name[s]: s for s in table.splits}
    empty = [name for name in REQUIRED if name not in present]  # declared, as check_init asserts, but empty
    split_dict = {name: WILDS_SPLITS[name] for name in sorted({*present, *empty}, key=WILDS_SPLITS.__getitem__)}
    fields = [*table.fields, "y"]
    maps = {field: _values(table.rows[field]) for field in table.fields}
    rows = table.rows
    metadata = rows.select(
        "example_id",
        (pl.lit(f"{IMAGES}/") + pl.col("file")).alias("path"),
        pl.col("split").replace_strict({s: WILDS_SPLITS[wilds_name[s]] for s in table.splits}, return_dtype=pl.Int64),
        pl.col("y").cast(pl.Int64),
        *[_codes(rows[field], maps[field]).alias(field) for field in table.fields],
    )
    info = {
        "dataset_name": benchmark,
        "version": table.split.version,
        "image_source": table.image_kind,
        "split_dict": split_dict,
        "split_names": {
            name: SPLIT_NAMES[present[name]] if name in present else f"{SPLIT_NAMES[name]}: empty"
            for name in split_dict
        },
        "split_sources": {name: source for name, source in present.items() if name != source},
        "empty_splits": empty,
        "metadata_fields": fields,
        "metadata_map": {**maps, "y": list(table.classes)},
        "n_classes": len(table.classes),
        "y_size": 1,
    }
    files = [(source, f"{IMAGES}/{file}") for source, file in rows.select("source", "file").iter_rows()]
    counts = {**dict.fromkeys(empty, 0), **{wilds_name[s]: n for s, n in rows.group_by("split").len().iter_rows()}}

    def write(folder: Path) -> None:
        metadata.write_csv(folder / "metadata.csv")
        (folder / "wilds.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", "utf-8")

    return Plan(files, dict(sorted(counts.items())), write)


def _values(column: pl.Series) -> list[object]:
    """A field's values in code order: sorted, a missing value (None) last."""
    present = sorted(column.drop_nulls().unique().to_list())
    return [*present, None] if column.null_count() else present


def _codes(column: pl.Series, values: list[object]) -> pl.Series:
    code = {value: i for i, value in enumerate(values)}
    return pl.Series(column.name, [code[v] for v in column.to_list()], dtype=pl.Int64)
