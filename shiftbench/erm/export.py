"""Export a published split so other trainers and algorithm zoos run on it; nothing is copied.

Layouts (``shiftbench export BENCHMARK DIR --layout ...``), each over symlinks to the resolved images:

- ``imagefolder``: ``DIR/<split>/<NNN_class>/<image>``, the layout DomainBed's and MetaShift's scripts
  read. Class folders are ``<y:03d>_<y_name>`` so that ImageFolder's alphabetical order is ``y``.
- ``wilds``: ``DIR/metadata.csv`` (one row per example: ``example_id``, ``path``, ``y``, ``split`` as
  WILDS' integer code, ``split_name``, ``group`` and the split's metadata fields), ``DIR/split_dict.json``
  and ``DIR/metadata_fields.json``: what a ``WILDSDataset`` subclass reads (``_split_dict``,
  ``_metadata_fields``, ``_split_array``, ``_y_array``, ``_metadata_array``).
- ``domainbed``: ``DIR/<environment>/<NNN_class>/<image>``, DomainBed's ``MultipleEnvironmentImageFolder``:
  one folder per environment (the split's ``group``, or ``--environment FIELD``), every class folder in
  every environment (DomainBed needs the same classes everywhere; some may be empty).
- ``hf``: Hugging Face ``datasets``' Parquet layout: ``DIR/data/<split>-00000-of-00001.parquet`` and a
  ``DIR/README.md`` whose YAML header declares the splits (``configs``) and the label names
  (``ClassLabel``), so ``datasets.load_dataset(DIR)`` returns one split per WILDS split.

An existing non-empty DIR is refused, so an export never mixes two splits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import polars as pl
import yaml

from shiftbench.erm.launch import PublishedSplit
from shiftbench.errors import InputError
from shiftbench.grouper import Grouper, metadata_table
from shiftbench.images import ImageSource, image_paths
from shiftbench.outputs import check_output_dir, empty_output_dir, inside, path_component

# WILDS' split codes: train/val/test 0/1/2 (wilds.datasets DEFAULT_SPLITS), id_val/id_test 3/4 as its
# datasets with ID splits number them; ood_train (BREEDS' target-domain training images) is 5 here.
WILDS_SPLITS = {"train": 0, "val": 1, "test": 2, "id_val": 3, "id_test": 4, "ood_train": 5}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# polars dtypes -> Hugging Face feature dtypes (the README declares every column).
HF_DTYPES = {"String": "string", "Int64": "int64", "Int32": "int32", "Float64": "float64", "Boolean": "bool"}


def class_folder(y: int, name: str) -> str:
    return f"{y:03d}_{_UNSAFE.sub('_', name).strip('_')[:80]}"


def check_target(target: Path) -> Path:
    """The export's folder: empty or creatable, writable, not under a file (checked before anything is read)."""
    return check_output_dir(target, "DIR")


def _prepare(target: Path) -> None:
    empty_output_dir(target, "DIR")


def _link_name(example_id: str, source: Path) -> str:
    """Example ids may be paths (BREEDS: train/<wnid>/<file>): flatten them into one file name."""
    name = path_component(example_id.replace("/", "__"))
    return name if Path(name).suffix else name + source.suffix


def _with_metadata(split: PublishedSplit) -> pl.DataFrame:
    """The split's examples with their metadata fields (the family's :func:`metadata_table`; ConDS: every
    attribute)."""
    rows = split.examples.sort("example_id")
    extra = split.path / f"{metadata_table(split.family)}.parquet"
    if extra.is_file():
        attributes = pl.read_parquet(extra).drop("benchmark", "version", "split", "y", strict=False)
        rows = rows.join(attributes, on="example_id", how="left")
    return rows


def _link_all(
    rows: pl.DataFrame, sources: list[Path], target: Path, folder_of: Callable[[dict[str, object]], Path]
) -> list[Path]:
    links = []
    for row, source in zip(rows.iter_rows(named=True), sources, strict=True):
        link = inside(target, folder_of(row) / _link_name(str(row["example_id"]), source))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source.resolve())
        links.append(link)
    return links


def _counts(rows: pl.DataFrame) -> dict[str, int]:
    return dict(rows.group_by("split").len().sort("split").iter_rows())


def export_imagefolder(split: PublishedSplit, images: ImageSource, target: Path) -> dict[str, int]:
    """``DIR/<split>/<NNN_class>/<image>``; returns the number of images per split."""
    rows = split.examples.sort("example_id")
    sources = image_paths(rows["example_id"].to_list(), images.root, images.template)
    _prepare(target)
    split_of = {name: path_component(name) for name in rows["split"].unique().to_list()}
    _link_all(
        rows,
        sources,
        target,
        lambda r: target / split_of[str(r["split"])] / class_folder(int(r["y"]), str(r["y_name"])),  # type: ignore[call-overload]
    )
    return _counts(rows)


def export_wilds(split: PublishedSplit, images: ImageSource, target: Path) -> dict[str, int]:
    """``metadata.csv``, ``split_dict.json``, ``metadata_fields.json`` and ``images/``."""
    rows = _with_metadata(split)
    sources = image_paths(rows["example_id"].to_list(), images.root, images.template)
    _prepare(target)
    links = _link_all(rows, sources, target, lambda r: target / "images")
    fields = ["y", "group", *[c for c in rows.columns if c not in ("example_id", "split", "y", "y_name", "group")]]
    metadata = rows.select(
        "example_id",
        pl.Series("path", [str(link.relative_to(target)) for link in links]),
        "y",
        "y_name",
        pl.col("split").replace_strict(WILDS_SPLITS, return_dtype=pl.Int64).alias("split"),
        pl.col("split").alias("split_name"),
        *[c for c in fields if c != "y"],
    )
    metadata.write_csv(target / "metadata.csv")
    present = {name: code for name, code in WILDS_SPLITS.items() if name in set(rows["split"])}
    (target / "split_dict.json").write_text(json.dumps(present, indent=2) + "\n", "utf-8")
    (target / "metadata_fields.json").write_text(json.dumps(fields, indent=2) + "\n", "utf-8")
    return _counts(rows)


def export_domainbed(
    split: PublishedSplit, images: ImageSource, target: Path, environment: str = "group"
) -> dict[str, int]:
    """``DIR/<environment>/<NNN_class>/<image>`` and ``environments.json`` (folder -> group name, as
    ``shiftbench eval --group-by`` names it); returns the number of images per environment.

    The environments are the groups of a :class:`Grouper` over one or more fields (``object_color``,
    ``y,object_color``); the split's own groups by default."""
    rows = _with_metadata(split)
    grouper = Grouper.parse(environment)
    usable = [c for c in rows.columns if c not in ("example_id", "y_name")]
    if (missing := grouper.unknown(usable)) is not None:
        fields = ", ".join(c for c in rows.columns if c not in ("example_id", "y", "y_name"))
        message = f"{missing!r} is not a field of {split.benchmark} (fields: {fields})"
        raise InputError(message, parameter="--environment")
    columns = [rows[field].to_list() for field in grouper.fields]
    classes = rows.select("y", "y_name").unique().sort("y")
    # Environment values become folders: each is one safe component, two values never share one (path_component).
    folders = [path_component(label) for label in grouper.labels(columns)]
    rows = rows.with_columns(pl.Series("_env", folders, dtype=pl.String), pl.Series("_group", grouper.names(columns)))
    sources = image_paths(rows["example_id"].to_list(), images.root, images.template)
    _prepare(target)
    for name in rows["_env"].unique().to_list():
        for y, y_name in classes.iter_rows():
            inside(target, target / name / class_folder(y, y_name)).mkdir(parents=True, exist_ok=True)
    _link_all(
        rows,
        sources,
        target,
        lambda r: target / str(r["_env"]) / class_folder(int(r["y"]), str(r["y_name"])),  # type: ignore[call-overload]
    )
    groups = dict(rows.select("_env", "_group").unique().sort("_env").iter_rows())
    (target / "environments.json").write_text(json.dumps(groups, indent=2) + "\n", "utf-8")
    return dict(rows.group_by("_env").len().sort("_env").iter_rows())


def export_hf(split: PublishedSplit, images: ImageSource, target: Path) -> dict[str, int]:
    """Hugging Face ``datasets``' Parquet layout: one file per split, a README.md declaring them."""
    rows = _with_metadata(split)
    paths = image_paths(rows["example_id"].to_list(), images.root, images.template)
    _prepare(target)
    rows = rows.with_columns(pl.Series("image_path", [str(p.resolve()) for p in paths]), pl.col("y").alias("label"))
    classes = rows.select("y", "y_name").unique().sort("y")
    label_names = {str(y): name for y, name in classes.iter_rows()}
    (target / "data").mkdir()
    configs = []
    for name in sorted(rows["split"].unique().to_list()):
        file = f"data/{path_component(name)}-00000-of-00001.parquet"
        rows.filter(pl.col("split") == name).drop("y").write_parquet(target / file)
        configs.append({"split": name, "path": file})
    features: list[dict[str, object]] = []
    for column, dtype in rows.drop("y").schema.items():
        if column == "label":
            features.append({"name": column, "dtype": {"class_label": {"names": label_names}}})
        else:
            features.append({"name": column, "dtype": HF_DTYPES.get(str(dtype), "string")})
    header = {"configs": [{"config_name": "default", "data_files": configs}], "dataset_info": {"features": features}}
    card = (
        f"---\n{yaml.safe_dump(header, sort_keys=False, allow_unicode=True)}---\n\n"
        f"# {split.benchmark}\n\nshiftbench split {split.benchmark}, version {split.version} ({split.family}). "
        "Images are referenced by `image_path`, not copied.\n"
    )
    (target / "README.md").write_text(card, "utf-8")
    return _counts(rows)


EXPORTS: dict[str, Callable[[PublishedSplit, ImageSource, Path], dict[str, int]]] = {
    "imagefolder": export_imagefolder,
    "wilds": export_wilds,
    "domainbed": export_domainbed,
    "hf": export_hf,
}
