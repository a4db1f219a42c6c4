"""Export a published split for other trainers, in the layouts their own loaders read, each loaded by that
client in the tests (``tests/test_export_clients.py``).

- ``imagefolder``: ``DIR/<split>/<y>_<class>/<image>``: torchvision's ``ImageFolder`` per split
  (:mod:`~shiftbench.exports.folders`).
- ``domainbed``: ``DIR/<environment>/<y>_<class>/<image>`` + ``environments.json``: DomainBed's
  ``MultipleEnvironmentImageFolder`` (:mod:`~shiftbench.exports.folders`).
- ``wilds``: ``metadata.csv`` + ``wilds.json`` + ``images/``: what a ``WILDSDataset`` subclass sets
  (:mod:`~shiftbench.exports.wilds`).
- ``hf``: Parquet with the images inside + ``README.md``: ``datasets.load_dataset(DIR)``
  (:mod:`~shiftbench.exports.hf`).

Everything is checked before anything is written (the flags, the fields, every image, every folder holding
every class, the validation split), then the export is written in a hidden folder inside ``DIR`` and moved into
place, so a refused or failed export leaves ``DIR`` as it was (:mod:`~shiftbench.exports.placing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from shiftbench.errors import InputError
from shiftbench.exports.placing import DEFAULT_MODE, ImageMode, Placed, place_images, staged_folder
from shiftbench.exports.table import ExportTable, Plan, load_table
from shiftbench.runtime.outputs import check_output_dir
from shiftbench.splits.images import ImageSource
from shiftbench.splits.published import PublishedSplit

Layout = Literal["imagefolder", "wilds", "domainbed", "hf"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


@dataclass(frozen=True)
class ExportOptions:
    """The choices of ``shiftbench export`` beside the split: None means the layout's default."""

    layout: Layout = "imagefolder"
    environment: str | None = None  # domainbed: FIELD[,FIELD]
    images: ImageMode | None = None  # imagefolder, wilds, domainbed: link (default), copy, symlink
    val_split: str | None = None  # wilds, hf: the split that is the client's validation split

    def check(self) -> None:
        """Refuse a flag the layout does not read (one line naming it)."""
        if self.environment is not None and self.layout != "domainbed":
            raise InputError("--environment is for --layout domainbed", parameter="--environment")
        if self.images is not None and self.layout == "hf":
            raise InputError(
                "--images is for imagefolder, wilds and domainbed: hf embeds the images", parameter="--images"
            )
        if self.val_split is not None and self.layout not in ("wilds", "hf"):
            raise InputError("--val-split is for --layout wilds or hf", parameter="--val-split")


@dataclass(frozen=True)
class Exported:
    """What an export wrote: images per split or environment (in DomainBed's order for domainbed) and how the
    images went in."""

    counts: dict[str, int]
    placed: Placed
    bytes: int


def check_target(target: Path) -> Path:
    """The export's folder: empty or creatable, writable, not under a file (checked before anything is read)."""
    return check_output_dir(target, "DIR")


def plan_export(table: ExportTable, options: ExportOptions) -> Plan:
    """The layout's plan, every check done (nothing written)."""
    from shiftbench.exports import folders, hf, wilds

    if options.layout == "imagefolder":
        return folders.imagefolder(table)
    if options.layout == "domainbed":
        return folders.domainbed(table, options.environment)
    if options.layout == "wilds":
        return wilds.wilds(table, options.val_split)
    return hf.hf(table, options.val_split)


def export(split: PublishedSplit, images: ImageSource, target: Path, options: ExportOptions) -> Exported:
    """Check everything, then write the export into ``target`` whole (or leave ``target`` as it was)."""
    options.check()
    check_target(target)
    plan = plan_export(load_table(split, images), options)
    with staged_folder(target) as work:
        placed = place_images(plan.files, work, options.images or DEFAULT_MODE)
        plan.write(work)
        size = sum(p.lstat().st_size for p in work.rglob("*") if p.is_file() and not p.is_symlink())
    return Exported(plan.counts, placed, size)
