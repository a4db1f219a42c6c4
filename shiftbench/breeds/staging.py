"""Staging one BREEDS benchmark: its tables from the inputs its spec reads, its card, its images block.

Three routes by what the spec names (:mod:`shiftbench.breeds.specs`): ImageNet-1k on the calibrated ImageNet
hierarchy (the papers' benchmarks), an ImageNet-21k class list on the 21k tree (:mod:`shiftbench.breeds.imagenet21k`,
the novel-subpopulations task included), or a labelled hierarchy file (:mod:`shiftbench.breeds.labelled`).
Inputs are read by name (the family's ``Input`` keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from shiftbench.breeds import calibrated as cal
from shiftbench.breeds import imagenet21k as in21k
from shiftbench.breeds import labelled
from shiftbench.breeds.build import FAMILY, build_tables
from shiftbench.breeds.figures import subclasses_per_superclass
from shiftbench.breeds.settings import BreedsSettings
from shiftbench.breeds.specs import BreedsSpec
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.family import Target
from shiftbench.runtime.cache import CachedArtifact
from shiftbench.splits.images import image_block
from shiftbench.store import StagedVersion
from shiftbench.warehouse.cards import CardInfo
from shiftbench.warehouse.publishing import stage_tables

# Bump when a change to the BREEDS builder can change its output: Dagster marks every
# benchmark stale and the automation rebuilds them.
CODE_VERSION = "breeds-2"
FIGURE = "subclasses_per_superclass.png"
# The family's inputs by name (shiftbench.breeds.family defines them with these keys).
WORDNET = "sources/imagenet_hierarchy"
IMAGES = "sources/imagenet_images"
CALIBRATED = "breeds/calibrated_hierarchy"
IN21K_HIERARCHY = "breeds/imagenet21k_hierarchy"
IN21K_IMAGES = "sources/imagenet21k_images"


def _imagenet1k_tables(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]
) -> tuple[dict[str, pl.DataFrame], CardInfo, dict[str, Any]]:
    spec = target.spec
    assert isinstance(spec, BreedsSpec)
    calibrated_artifact, images = inputs[CALIBRATED], inputs[IMAGES]
    calibrated = cal.CalibratedHierarchy.load(calibrated_artifact.path)
    image_table = pl.read_parquet(images.path / "images.parquet")
    image_sources = {"images": images.meta["kind"], "images_sha256": images.fingerprint}
    tables = build_tables(spec, calibrated, image_table, image_sources, overrides=target.overrides)
    root = settings.of(BreedsSettings).imagenet_dir
    return (
        tables,
        card_info(calibrated.kind, spec.split),
        {
            "origin": {"hierarchy": calibrated.origin, "images": images.meta.get("path")},
            "images": image_block("imagenet", "{}", root, "imagenet_dir"),
        },
    )


def _imagenet21k_tables(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]
) -> tuple[dict[str, pl.DataFrame], CardInfo, dict[str, Any]]:
    spec = target.spec
    assert isinstance(spec, BreedsSpec)
    calibrated, record = in21k.spec_hierarchy(settings, spec, inputs[IN21K_HIERARCHY])
    images = inputs[IN21K_IMAGES]
    image_table = pl.read_parquet(images.path / "images.parquet")
    seen: list[str] = []
    if spec.task == "novel":
        seen = pl.read_parquet(inputs[IMAGES].path / "classes.parquet")["wnid"].to_list()
    image_sources = {"images": images.meta["kind"], "images_sha256": images.fingerprint, **record}
    tables = build_tables(
        spec, calibrated, image_table, image_sources, overrides=target.overrides, dataset=in21k.DATASET, seen=seen
    )
    root = settings.of(BreedsSettings).imagenet21k_dir
    if root is not None and tables["examples"].height == 0:  # the folder is set but holds none of these classes
        raise InputError(
            f"none of the {tables['breeds_subpopulations'].height} subclasses of {target.benchmark} has a class folder "
            f"under {root}",
            parameter="SHIFTBENCH_IMAGENET21K_DIR",
        )
    lines = in21k.card_lines(record, tables["examples"].height, root is not None)
    return (
        tables,
        card_info(calibrated.kind, spec.split, extra=lines, task=spec.task),
        {
            "origin": {"hierarchy": calibrated.origin, "images": images.meta.get("path")},
            "images": image_block("imagenet", "{}", root, "imagenet21k_dir"),
        },
    )


def _labelled_tables(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]
) -> tuple[dict[str, pl.DataFrame], CardInfo, dict[str, Any]]:
    spec = target.spec
    assert isinstance(spec, BreedsSpec)
    calibrated = labelled.calibrated(spec)
    empty = pl.DataFrame(schema=in21k.IMAGE_COLUMNS)
    tables = build_tables(
        spec, calibrated, empty, {"images": "none"}, overrides=target.overrides, dataset=str(spec.dataset_tag)
    )
    return (
        tables,
        labelled.card_info(calibrated, SPLIT_SHIFT[spec.split], CITATION),
        {
            "origin": {"hierarchy": calibrated.origin},
            "images": image_block("user", "{}", None, None),
        },
    )


def stage_benchmark(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Build one benchmark's tables and stage them as an (unpublished) version."""
    spec = target.spec
    assert isinstance(spec, BreedsSpec)
    if spec.hierarchy is not None:
        tables, card, where = _labelled_tables(settings, target, inputs)
    elif spec.is_imagenet1k:
        tables, card, where = _imagenet1k_tables(settings, target, inputs)
    else:
        tables, card, where = _imagenet21k_tables(settings, target, inputs)

    def figures() -> dict[str, bytes]:
        title = f"{target.benchmark}: subclasses per superclass"
        return {FIGURE: subclasses_per_superclass(tables["breeds_subpopulations"], title)}

    return stage_tables(
        settings,
        FAMILY,
        target.benchmark,
        tables,
        spec=spec.name,
        origin=where["origin"],
        code_version=CODE_VERSION,
        images=where["images"],
        attachments=figures,
        card=card,
        check=target.check,
    )


def needs(settings: Settings, spec: object) -> tuple[str, ...]:
    """The inputs a spec reads: ImageNet-1k's, ImageNet-21k's (and the 1k classes for a novel task), or none."""
    assert isinstance(spec, BreedsSpec)
    if spec.hierarchy is not None:
        return ()
    if spec.is_imagenet1k:
        return (CALIBRATED, IMAGES)
    novel = (IMAGES,) if spec.task == "novel" else ()
    return (IN21K_HIERARCHY, IN21K_IMAGES, *novel)


CITATION = "S. Santurkar, D. Tsipras, A. Madry. BREEDS: Benchmarks for Subpopulation Shift. ICLR 2021."
SPLIT_SHIFT = {
    "rand": "subclasses are split between source and target at random (the published benchmarks)",
    "good": "similar subclasses are put on both sides (a smaller shift)",
    "bad": "similar subclasses are kept on one side (a larger shift)",
    "none": "there is no split: source and target hold the same subclasses (no subpopulation shift)",
}


def card_info(kind: str, split: str, *, extra: tuple[str, ...] = (), task: str = "breeds") -> CardInfo:
    """What a BREEDS version's card says: the subpopulation shift and the hierarchy's and images' licences.

    ``extra``: an ImageNet-21k version's lines on its classes (timm's list, version, SHA-256) and images.
    """
    if kind.startswith(cal.KIND_WORDNET):
        hierarchy = "Hierarchy: WordNet 3.0 (WordNet 3.0 licence), calibrated by shiftbench's own rule (MIT)"
    else:
        hierarchy = "Hierarchy: the BREEDS calibration (BREEDS-Benchmarks, MIT) of WordNet 3.0 (WordNet 3.0 licence)"
    if "+edits" in kind or kind.startswith(cal.KIND_FILES):
        hierarchy += ", with the user's changes"
    images = (
        "Images: ImageNet ILSVRC-2012 (ImageNet terms of access: non-commercial research and education); "
        "not redistributed",
    )
    shift = (
        f"the source domain (splits train, id_test) and the target domain (test, ood_train) hold different ImageNet "
        f"classes (subpopulations) of it; {SPLIT_SHIFT[split]}"
    )
    if task == "novel":
        shift = (
            "the source domain (train, id_test) holds ImageNet-1k classes of it, the target domain (test, ood_train) "
            "ImageNet-21k classes outside the 1k (subpopulations an ILSVRC-trained model has never seen)"
        )
    return CardInfo(
        title="BREEDS benchmark",
        shift=f"Subpopulation shift: each superclass is a label; {shift}.",
        licences=(hierarchy, *(extra or images)),
        citation=CITATION,
    )
