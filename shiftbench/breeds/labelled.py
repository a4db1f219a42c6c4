"""BREEDS on any labelled hierarchy: a dataset's own semantic grouping (CIFAR-100's superclasses, Open Images').

The BREEDS recipe needs only a grouping of the dataset's classes: a hierarchy file
(:mod:`shiftbench.sources.labelled_hierarchy`; parent -> child pairs in CSV or Parquet, or Open Images'
JSON) whose leaves are the classes. The file is the hierarchy as given (no calibration); its SHA-256
goes into the version's sources. No images are listed: the version holds the classes and
subpopulations, which a user joins to their own images by class id.
"""

from __future__ import annotations

from pathlib import Path

from shiftbench.breeds.calibrated import CalibratedHierarchy
from shiftbench.breeds.specs import BreedsSpec
from shiftbench.sources.labelled_hierarchy import SHIPPED_HIERARCHIES, read_labelled_hierarchy
from shiftbench.warehouse.cards import CardInfo

KIND = "labelled-hierarchy"
SOURCES = {  # what the card says of a shipped grouping
    "cifar100": "Hierarchy: CIFAR-100's 20 superclasses x 5 classes, as published with the dataset (A. Krizhevsky, "
    "Learning Multiple Layers of Features from Tiny Images, 2009), shipped as shiftbench/data/cifar100_hierarchy.csv",
}


def hierarchy_path(spec: BreedsSpec) -> Path:
    assert spec.hierarchy is not None
    return SHIPPED_HIERARCHIES.get(spec.hierarchy, Path(spec.hierarchy))


def calibrated(spec: BreedsSpec) -> CalibratedHierarchy:
    """The spec's hierarchy file, read and checked, as the hierarchy a BREEDS build reads."""
    path = hierarchy_path(spec)
    read = read_labelled_hierarchy(path, tree=spec.tree)
    sources = {"hierarchy": KIND, "hierarchy_sha256": read.fingerprint, "hierarchy_format": read.format}
    origin = {"hierarchy_file": str(spec.hierarchy), "path": read.source}
    return CalibratedHierarchy(read.hierarchy, read.classes, KIND, sources, origin)


def card_info(hierarchy: CalibratedHierarchy, split_shift: str, citation: str) -> CardInfo:
    name = str(hierarchy.origin.get("hierarchy_file"))
    described = SOURCES.get(name, f"Hierarchy: the user's file {Path(name).name}")
    return CardInfo(
        title="BREEDS benchmark",
        shift="Subpopulation shift: each superclass is a label; the source and the target domain hold different "
        f"classes (subpopulations) of it; {split_shift}.",
        licences=(
            f"{described} (SHA-256 {hierarchy.sources['hierarchy_sha256']})",
            "Images: none listed: this version holds the classes and subpopulations of the hierarchy only",
        ),
        citation=citation,
    )
