"""Hugging Face ``datasets``' Parquet layout, self-contained: the images are inside the Parquet files.

``DIR/data/<split>-NNNNN-of-NNNNN.parquet`` (shards of at most about 500 MB of images, as ``push_to_hub``
makes them) and ``DIR/README.md``, whose YAML header declares the splits (``configs``) and the features:
``image`` (HF's ``Image``: the file's bytes and its name, so ``ds[0]["image"]`` is a PIL image), ``label``
(a ``ClassLabel`` with the class names), ``example_id``, ``split`` (shiftbench's split name), ``group`` and
the split's metadata fields. The Parquet files carry the same features in their schema metadata, so
``load_dataset("parquet", data_files=...)`` reads them alike. ``datasets.load_dataset(DIR)`` returns one
split per shiftbench split, named as HF users expect: ``train``, ``validation`` (``val``, or ``id_val`` when
there is no ``val``, or ``--val-split``; see :mod:`shiftbench.exports.splits`), ``test``; the others
(``id_val`` beside a ``val``, ``id_test``, ``ood_train``) keep their names. Nothing points outside ``DIR``:
it can be moved, copied or pushed as it is.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from shiftbench.exports.splits import validation_split
from shiftbench.exports.table import ExportTable, Plan
from shiftbench.splits.images import STANDIN

MAX_SHARD_BYTES = 500 * 10**6  # datasets' push_to_hub default max_shard_size
ROWS_PER_GROUP = 100  # datasets writes image datasets in row groups of 100 rows
VALUE_TYPES = {"String": "string", "Int64": "int64", "Int32": "int32", "Float64": "float64", "Boolean": "bool"}
COLUMNS = ("example_id", "split", "group")
HF_ORDER = ("train", "validation", "test")  # datasets' Split.TRAIN, VALIDATION, TEST: listed first, in this order


def hf(table: ExportTable, val_split: str | None) -> Plan:
    """Plan the Parquet shards and the card (nothing written)."""
    validation = validation_split(table.split.benchmark, table.splits, val_split)
    names = {s: "validation" if s == validation else s for s in table.splits}
    rows = _columns(table)
    shards = {names[s]: _shards(rows.filter(pl.col("split") == s)) for s in table.splits}
    features = _features(table, rows)

    def write(folder: Path) -> None:
        (folder / "data").mkdir()
        schema = _schema(rows).with_metadata(
            {"huggingface": json.dumps({"info": {"features": _arrow_features(features)}})}
        )
        for name, parts in shards.items():
            for i, part in enumerate(parts):
                _write_shard(folder / "data" / f"{name}-{i:05d}-of-{len(parts):05d}.parquet", part, schema)
        (folder / "README.md").write_text(_card(table, names, features), "utf-8")

    counts = {names[s]: n for s, n in table.rows.group_by("split").len().iter_rows()}
    return Plan([], dict(sorted(counts.items())), write)


def _columns(table: ExportTable) -> pl.DataFrame:
    """The rows as the dataset holds them (``source``/``file`` feed the image column)."""
    others = [f for f in table.fields if f != "group"]
    casts = [pl.col(f) if str(table.rows.schema[f]) in VALUE_TYPES else pl.col(f).cast(pl.String) for f in others]
    return table.rows.select("source", "file", pl.col("y").cast(pl.Int64).alias("label"), *COLUMNS, *casts)


def _shards(rows: pl.DataFrame) -> list[pl.DataFrame]:
    """Consecutive runs of rows holding at most MAX_SHARD_BYTES of image bytes each (at least one row)."""
    sizes = [Path(p).stat().st_size for p in rows["source"].to_list()]
    cuts, total = [0], 0
    for i, size in enumerate(sizes):
        if total + size > MAX_SHARD_BYTES and i > cuts[-1]:
            cuts.append(i)
            total = 0
        total += size
    cuts.append(len(sizes))
    return [rows.slice(start, end - start) for start, end in itertools.pairwise(cuts)]


def _features(table: ExportTable, rows: pl.DataFrame) -> list[dict[str, Any]]:
    features: list[dict[str, Any]] = [
        {"name": "image", "dtype": "image"},
        {"name": "label", "dtype": {"class_label": {"names": {str(y): n for y, n in enumerate(table.classes)}}}},
    ]
    for column in rows.columns[3:]:
        features.append({"name": column, "dtype": VALUE_TYPES.get(str(rows.schema[column]), "string")})
    return features


def _arrow_features(features: list[dict[str, Any]]) -> dict[str, Any]:
    """The features as ``datasets`` records them in a Parquet schema (``Features.to_dict``)."""
    out: dict[str, Any] = {}
    for feature in features:
        dtype = feature["dtype"]
        if dtype == "image":
            out[feature["name"]] = {"_type": "Image"}
        elif isinstance(dtype, dict):
            out[feature["name"]] = {"names": list(dtype["class_label"]["names"].values()), "_type": "ClassLabel"}
        else:
            out[feature["name"]] = {"dtype": dtype, "_type": "Value"}
    return out


def _schema(rows: pl.DataFrame) -> pa.Schema:
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    values = rows.drop("source", "file").head(0).to_arrow().schema
    fields = [
        pa.field("image", image),
        *(values.field(i).with_type(_plain(values.field(i).type)) for i in range(len(values))),
    ]
    return pa.schema(fields)


def _plain(kind: pa.DataType) -> pa.DataType:
    return pa.string() if pa.types.is_large_string(kind) or pa.types.is_string_view(kind) else kind


def _write_shard(path: Path, part: pl.DataFrame, schema: pa.Schema) -> None:
    """Stream the shard in row groups, reading ROWS_PER_GROUP images at a time."""
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, part.height, ROWS_PER_GROUP):
            chunk = part.slice(start, ROWS_PER_GROUP)
            images = [{"bytes": Path(s).read_bytes(), "path": f} for s, f in chunk.select("source", "file").iter_rows()]
            columns = {"image": images, **{c: chunk[c].to_list() for c in schema.names[1:]}}
            writer.write_table(pa.Table.from_pydict(columns, schema=schema))


def _card(table: ExportTable, names: dict[str, str], features: list[dict[str, Any]]) -> str:
    order = sorted(names.values(), key=lambda name: (HF_ORDER.index(name) if name in HF_ORDER else len(HF_ORDER), name))
    configs = [{"split": name, "path": f"data/{name}-*"} for name in order]
    header = {"configs": [{"config_name": "default", "data_files": configs}], "dataset_info": {"features": features}}
    renamed = ", ".join(f"`{hf_name}` is shiftbench's `{s}`" for s, hf_name in names.items() if hf_name != s)
    split = table.split
    images = "stand-in images (generated: not the dataset's)" if table.image_kind == STANDIN else "its images"
    return (
        f"---\n{yaml.safe_dump(header, sort_keys=False, allow_unicode=True)}---\n\n"
        f"# {split.benchmark}\n\n"
        f"shiftbench split {split.benchmark}, version {split.version} ({split.family}, dataset {split.dataset}), "
        f"with {images} embedded in the Parquet files (HF's `Image` feature).\n\n"
        f"Splits: {', '.join(order)}{f' ({renamed})' if renamed else ''}; the `split` column "
        "keeps shiftbench's name of each example's split, `example_id` its id (to score predictions with "
        "`shiftbench eval`).\n"
    )
