"""Whose images a result is on: one vocabulary, ``real | generated | standin`` (``unrecorded`` for old versions).

Every surface that shows results (the ``results`` and ``leaderboard`` views, ``shiftbench leaderboard``, the
Dagster metadata of a run, the cards, the analyses) labels a result by its **images**:

- ``real``: the dataset's own images (ImageNet, Visual Genome via GQA, CelebA, or the user's images of a split:
  ``--image-root``, a user's table);
- ``generated``: the split's own images are generated: the ConDS sprites (shiftbench's generated dataset), or a
  split of generated data (``NAME@generated``) read with images of the user's. A result on that generated data,
  never on photographs;
- ``standin``: generated stand-ins in place of a split's images (:mod:`shiftbench.splits.standin`): a run trained with
  ``--image-root standin``, or any result on a split that has no images but stand-ins (MetaShift's generated
  scene sample, ``NAME@generated``, whose manifest records ``images.source: standin``; predictions scored on it
  were made from the exported stand-ins). These numbers say nothing about any real dataset;
- ``unrecorded``: predictions scored before shiftbench recorded the images of the scored split (or on a split that
  records none).

The label follows from the image source a result records (``erm_runs.image_source``, ``eval_runs.image_source``:
the split's ``images.source``) and the split's ``@TAG`` (:func:`images_of`); the catalog computes the same in SQL
(the macro ``shiftbench_images`` in ``sql/catalog/create_union_views.sql``, tested to agree). The default
leaderboard shows ``real`` and ``generated`` rows (:data:`SHOWN_BY_DEFAULT`), each labelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shiftbench.specs.naming import TAG_SEPARATOR

REAL, GENERATED, STANDIN, UNRECORDED = "real", "generated", "standin", "unrecorded"
IMAGES = (REAL, GENERATED, STANDIN, UNRECORDED)
SHOWN_BY_DEFAULT = (REAL, GENERATED)  # a reader's leaderboard: results on the split's own images
GENERATED_SOURCES = frozenset({"sprites"})  # image sources that are a dataset of generated images
GENERATED_TAG = "generated"  # NAME@generated: a split of generated data
MEANINGS = {
    REAL: "the dataset's own images",
    GENERATED: "the split's own images are generated (the ConDS sprites, NAME@generated): results on generated "
    "data, not on photographs",
    STANDIN: "generated stand-in images (shiftbench/splits/standin.py), not the dataset's; these numbers say nothing "
    "about the real images",
    UNRECORDED: "no image source recorded (predictions scored before shiftbench recorded the split's, or a split "
    "that records none): score them again to label them",
}
CARD_TITLES = {GENERATED: " (generated images)", STANDIN: " (stand-in images)", UNRECORDED: ""}


def data_tag(benchmark: str) -> str | None:
    """The ``@TAG`` of a benchmark's name (:mod:`shiftbench.specs.naming`), None for a paper's or a user's name (as the
    views' ``data_tag``: ``split_part(benchmark, '@', 2)``)."""
    parts = benchmark.split(TAG_SEPARATOR)
    return parts[1] or None if len(parts) > 1 else None


def images_of(image_source: str | None, tag: str | None) -> str:
    """The label of a result whose images came from ``image_source`` on a split tagged ``tag``."""
    if not image_source or image_source == UNRECORDED:
        return UNRECORDED
    if image_source == STANDIN:
        return STANDIN
    if image_source in GENERATED_SOURCES or tag == GENERATED_TAG:
        return GENERATED
    return REAL


def split_image_source(manifest: Mapping[str, Any]) -> str | None:
    """The image source a split's manifest records (``images.source``), None when it records none."""
    block = manifest.get("images")
    source = block.get("source") if isinstance(block, Mapping) else None
    return str(source) if source else None


def legend(images: str) -> str:
    """The line under a table that shows rows labelled ``images``."""
    return f"images '{images}': {MEANINGS[images]}"


def card_sentence(images: str, scored: bool = False) -> str:
    """What a results card says about its images ('' for real ones)."""
    if images == STANDIN:
        made = "Scored on a split whose only images are" if scored else "Trained and evaluated on"
        return (
            f" {made} generated stand-in images (shiftbench.splits.standin), not the split's own images: these "
            "accuracies say nothing about the real dataset."
        )
    if images == GENERATED:
        return " The split's images are generated (not photographs): these are results on generated data."
    if images == UNRECORDED:
        return " The split records no image source."
    return ""
