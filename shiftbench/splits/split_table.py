"""A published split's examples as arrays: what training, the torch dataset and the WILDS-style metadata read.

Read with pyarrow only (the training job runs where polars and duckdb are absent): ``examples.parquet`` and the
family's metadata table (:func:`~shiftbench.scoring.grouper.metadata_table`), in ``example_id`` order, labels checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from shiftbench.errors import InputError
from shiftbench.scoring.grouper import metadata_table

_BASE_COLUMNS = {"benchmark", "version", "example_id", "split", "y"}


@dataclass(frozen=True)
class SplitTable:
    """The examples of one benchmark version, in ``example_id`` order."""

    benchmark: str
    version: str
    example_ids: list[str]
    splits: np.ndarray  # str
    y: np.ndarray  # int64
    group_index: np.ndarray  # int64, indexes group_names
    group_names: list[str]  # every group of the benchmark, sorted
    class_names: list[str]  # class_names[y]
    metadata: np.ndarray  # int64 [N, len(metadata_fields)]
    metadata_fields: list[str]
    metadata_levels: list[list[str]] | None = None  # each field's value text by code (None: the codes)

    def decoded(self, field: str) -> list[str]:
        """A metadata field's values as the split stores them (group names, labels, attribute text)."""
        codes = self.metadata[:, self.metadata_fields.index(field)]
        if self.metadata_levels is None:
            return [str(int(c)) for c in codes]
        levels = self.metadata_levels[self.metadata_fields.index(field)]
        return [levels[int(c)] for c in codes]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def indices(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.splits == split)

    @property
    def split_names(self) -> list[str]:
        order = ["train", "ood_train", "id_val", "val", "id_test", "test"]
        present = set(self.splits.tolist())
        return [s for s in order if s in present] + sorted(present - set(order))


def read_split(version_dir: Path) -> SplitTable:
    """``examples.parquet`` (and the family's metadata table, :func:`metadata_table`, when there is one) of a
    version."""
    path = version_dir / "examples.parquet"
    if not path.is_file():
        raise InputError("no examples table in this version", path=path)
    table = pq.read_table(path).sort_by("example_id")
    columns = {name: table.column(name).to_pylist() for name in ("example_id", "split", "y", "y_name", "group")}
    y = np.asarray(columns["y"], dtype=np.int64)
    if y.size == 0:
        raise InputError("the benchmark has no examples", path=path)
    names: dict[int, str] = {}
    for label, name in zip(y.tolist(), columns["y_name"], strict=True):
        if names.setdefault(label, name) != name:
            raise InputError(f"label {label} has two names: {names[label]!r} and {name!r}", path=path)
    if y.min() < 0 or sorted(names) != list(range(len(names))):
        raise InputError(
            f"labels must be 0..K-1 without gaps; found {sorted(names)[:10]}{' ...' if len(names) > 10 else ''}",
            path=path,
        )
    group_names = sorted(set(columns["group"]))
    position = {g: i for i, g in enumerate(group_names)}
    group_index = np.asarray([position[g] for g in columns["group"]], dtype=np.int64)
    fields, values = ["group", "y"], [group_index, y]
    levels: list[list[str]] = [group_names, [str(k) for k in range(len(names))]]
    metadata = metadata_table(str(table.column("family")[0]))
    attributes = version_dir / f"{metadata}.parquet"
    if attributes.is_file():  # the family's metadata fields (ConDS: the attributes) are WILDS metadata fields
        extra = pq.read_table(attributes).sort_by("example_id")
        if extra.column("example_id").to_pylist() != columns["example_id"]:
            raise InputError(f"{metadata} and examples list different examples", path=attributes)
        for name in extra.column_names:
            if name in _BASE_COLUMNS:
                continue
            raw = [str(v) for v in extra.column(name).to_pylist()]
            ordered = sorted(set(raw))
            code = {v: i for i, v in enumerate(ordered)}
            fields.append(name)
            values.append(np.asarray([code[v] for v in raw], dtype=np.int64))
            levels.append(ordered)
    versions = set(table.column("version").to_pylist())
    benchmarks = set(table.column("benchmark").to_pylist())
    return SplitTable(
        benchmark=benchmarks.pop(),
        version=versions.pop(),
        example_ids=list(columns["example_id"]),
        splits=np.asarray(columns["split"]),
        y=y,
        group_index=group_index,
        group_names=group_names,
        class_names=[names[k] for k in range(len(names))],
        metadata=np.stack(values, axis=1),
        metadata_fields=fields,
        metadata_levels=levels,
    )
