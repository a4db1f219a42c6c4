"""Folder trees that torchvision's ``ImageFolder`` reads: ``imagefolder`` (one per split) and ``domainbed`` (one
per environment, as DomainBed's ``MultipleEnvironmentImageFolder`` builds them).

``ImageFolder`` numbers the classes of *its* folder by their sorted subfolders and refuses an empty one, so a
folder lacking a class would either fail or silently shift every label after it. Hence the rule both layouts
keep, checked before anything is written: every folder holds every class, each class folder is
``<y>_<name>`` with ``y`` zero-padded to one width (sorted order = ``y``, so ``class_to_idx`` gives ``y``), and
a choice that cannot satisfy it is refused in one line naming the folder and the class it lacks.

DomainBed's environments are the sorted subfolders of ``DIR`` (``--test_envs`` indexes them). By default they
are the splits: every split of every shipped benchmark holds every class, and a split is what the papers'
domain-generalisation protocols hold out (MetaShift's train and test domains are its train and test
communities; BREEDS' target subpopulations are ``test``). ``--environment FIELD[,FIELD]`` takes the groups of
other metadata fields instead (ConDS: an attribute, ``object_color``, as ColoredMNIST's colours); the split's own
``group`` or the label itself hold one class each and are refused. ``environments.json`` lists the
environments in DomainBed's order with their group names (as ``shiftbench eval --group-by`` names them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError
from shiftbench.exports.table import ExportTable, Plan
from shiftbench.runtime.outputs import path_component
from shiftbench.scoring.grouper import Grouper

# torchvision.datasets.folder.IMG_EXTENSIONS: ImageFolder silently skips any other file.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
INDEX = "environments.json"
DEFAULT_ENVIRONMENT = "split"


def imagefolder(table: ExportTable) -> Plan:
    """``DIR/<split>/<y>_<class>/<file>``: one ImageFolder per split, the same classes in every one."""
    splits = table.rows["split"].to_list()
    folders = distinct_folders(splits, splits)
    rows = table.rows.with_columns(pl.Series("folder", [folders[s] for s in splits], dtype=pl.String))
    _require_every_class(table, rows, lambda folder: f"split {folder!r}", "--layout", lambda: _IMAGEFOLDER_HINT)
    return _tree(table, rows)


_IMAGEFOLDER_HINT = "an ImageFolder per split would number the classes differently: use --layout wilds or hf"


def domainbed(table: ExportTable, environment: str | None) -> Plan:
    """``DIR/<environment>/<y>_<class>/<file>`` and ``environments.json``."""
    grouper = parse_environment(environment)
    usable = [c for c in table.rows.columns if c not in ("example_id", "y_name", "source", "file")]
    if (missing := grouper.unknown(usable)) is not None:
        fields = ", ".join(usable)
        raise InputError(
            f"{missing!r} is not a field of {table.split.benchmark} (fields: {fields})", parameter="--environment"
        )
    columns = [table.rows[field].to_list() for field in grouper.fields]
    names = grouper.names(columns)
    folders = distinct_folders(names, grouper.labels(columns), reserved=(INDEX,))
    rows = table.rows.with_columns(pl.Series("folder", [folders[n] for n in names], dtype=pl.String))
    named = dict(zip(folders.values(), folders.keys(), strict=True))

    def what(folder: str) -> str:
        return f"environment {named[folder]!r}"

    _require_every_class(table, rows, what, "--environment", lambda: _suggestion(table))
    tree = _tree(table, rows)
    environments = [
        {"index": i, "folder": folder, "environment": named[folder], "images": tree.counts[folder]}
        for i, folder in enumerate(sorted(tree.counts))
    ]
    classes = [{"index": y, "folder": f, "y": y, "y_name": n} for y, (n, f) in enumerate(_class_folders(table).items())]
    index = {
        "benchmark": table.split.benchmark,
        "version": table.split.version,
        "image_source": table.image_kind,
        "fields": list(grouper.fields),
    }
    text = json.dumps({**index, "environments": environments, "classes": classes}, indent=2, ensure_ascii=False)

    def write(folder: Path) -> None:
        (folder / INDEX).write_text(text + "\n", "utf-8")

    return Plan(tree.files, tree.counts, write)


def parse_environment(environment: str | None) -> Grouper:
    """``--environment``: comma-separated fields, none of them empty (default: the splits)."""
    if environment is None:
        return Grouper((DEFAULT_ENVIRONMENT,))
    fields = [f.strip() for f in environment.split(",")]
    if not any(fields) or not all(fields):
        raise InputError(f"{environment!r} names an empty field: give FIELD[,FIELD]", parameter="--environment")
    return Grouper(tuple(fields))


def distinct_folders(keys: Sequence[str], labels: Sequence[str], reserved: Sequence[str] = ()) -> dict[str, str]:
    """One folder per key, named by its label as one safe path component; labels that would share a folder (equal,
    equal ignoring case, or a ``reserved`` name such as the index file) get a short hash of their key."""
    label_of = dict(zip(keys, labels, strict=True))
    base = {key: path_component(label) for key, label in sorted(label_of.items())}
    taken: dict[str, int] = {name.casefold(): 1 for name in reserved}
    for name in base.values():
        taken[name.casefold()] = taken.get(name.casefold(), 0) + 1
    return {
        key: f"{name}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:8]}" if taken[name.casefold()] > 1 else name
        for key, name in base.items()
    }


def _class_folders(table: ExportTable) -> dict[str, str]:
    """Class name -> ``<y>_<name>``, ``y`` padded to one width so that sorted folders are in label order."""
    width = max(3, len(str(len(table.classes) - 1)))
    return {name: f"{y:0{width}d}_{path_component(name)}" for y, name in enumerate(table.classes)}


def _tree(table: ExportTable, rows: pl.DataFrame) -> Plan:
    folder_of_class = list(_class_folders(table).values())
    files = [
        (source, f"{folder}/{folder_of_class[y]}/{file}")
        for source, folder, y, file in rows.select("source", "folder", "y", "file").iter_rows()
    ]
    counts = dict(rows.group_by("folder").len().sort("folder").iter_rows())
    return Plan(files, counts)


def _require_every_class(
    table: ExportTable, rows: pl.DataFrame, what: Callable[[str], str], parameter: str, hint: Callable[[], str]
) -> None:
    """Refuse a tree in which a folder lacks a class, or an image ImageFolder would not read."""
    unread = [f for f in table.rows["file"].to_list() if not f.lower().endswith(IMAGE_SUFFIXES)]
    if unread:
        raise InputError(
            f"{len(unread):,} images have suffixes ImageFolder skips (first: {unread[0]}); use --layout wilds or hf",
            parameter="--layout",
        )
    present = rows.group_by("folder").agg(pl.col("y").unique()).sort("folder")
    for folder, labels in present.iter_rows():
        lacking = sorted(set(range(len(table.classes))) - set(labels))
        if lacking:
            raise InputError(
                f"{what(folder)} of {table.split.benchmark} has no image of class "
                f"{', '.join(table.class_name(y) for y in lacking[:3])}{' ...' if len(lacking) > 3 else ''}: {hint()}",
                parameter=parameter,
            )


def _suggestion(table: ExportTable) -> str:
    """The hint of a refused ``--environment``: the single fields whose every value holds every class."""
    fields = [DEFAULT_ENVIRONMENT, *(f for f in table.fields if f != DEFAULT_ENVIRONMENT)]
    working = []
    for field in fields:
        per_value = table.rows.group_by(field).agg(pl.col("y").n_unique().alias("n"))
        if per_value.height > 1 and (per_value["n"] == len(table.classes)).all():
            working.append(field)
    reason = "DomainBed reads each environment as an ImageFolder and needs every class in every one"
    if not working:
        return f"{reason}; no single field does: use --layout wilds or hf"
    return f"{reason}; fields whose environments all do: {', '.join(working)}"
