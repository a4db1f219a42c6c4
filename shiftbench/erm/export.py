"""Export a published split for other trainers: ``DIR/<split>/<class>/<image>`` folders of symlinks.

The ImageFolder layout DomainBed and the MetaShift scripts read. Class folders are named
``<y:03d>_<y_name>`` so that the alphabetical order ImageFolder assigns indices by is the
benchmark's ``y``. Links point at the resolved image files; nothing is copied. An existing
non-empty DIR is refused, so an export never mixes two splits.
"""

from __future__ import annotations

import re
from pathlib import Path

from shiftbench.erm.launch import PublishedSplit
from shiftbench.errors import InputError
from shiftbench.images import ImageSource, image_paths

LAYOUTS = ("imagefolder",)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def class_folder(y: int, name: str) -> str:
    return f"{y:03d}_{_UNSAFE.sub('_', name).strip('_')[:80]}"


def export_imagefolder(split: PublishedSplit, images: ImageSource, target: Path) -> dict[str, int]:
    """Write the symlinks; returns the number of images per split."""
    if target.exists() and any(target.iterdir()):
        raise InputError("target directory is not empty", path=target, parameter="DIR")
    rows = split.examples.sort("example_id")
    sources = image_paths(rows["example_id"].to_list(), images.root, images.template)
    counts: dict[str, int] = {}
    for (example_id, split_name, y, y_name), source in zip(
        rows.select("example_id", "split", "y", "y_name").iter_rows(), sources, strict=True
    ):
        folder = target / split_name / class_folder(y, y_name)
        folder.mkdir(parents=True, exist_ok=True)
        # Example ids may be paths (BREEDS: train/<wnid>/<file>): flatten them into one file name.
        name = _UNSAFE.sub("_", example_id.replace("/", "__"))
        if not Path(name).suffix:
            name += source.suffix
        (folder / name).symlink_to(source.resolve())
        counts[split_name] = counts.get(split_name, 0) + 1
    return counts
