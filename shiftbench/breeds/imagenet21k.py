"""BREEDS on ImageNet-21k: its class lists on WordNet, calibrated by the project's own rule, and its images.

The class lists (ImageNet-21k, -22k, -12k and MIIL's, from timm's data files: shipped derived data,
or an installed timm's files) are placed on WordNet 3.0 restricted to the ancestors of all of them,
calibrated as ``wordnet-default`` is (a user edit file, then each node keeps its deepest parent), so
every list's benchmarks share one tree: a level means the same nodes whichever list a spec draws
from. The few listed synsets that WordNet 3.0 lacks are left out and named on the input and the cards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.breeds import calibrated as cal
from shiftbench.breeds.settings import BreedsSettings
from shiftbench.breeds.specs import BreedsSpec
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.runtime.cache import CachedArtifact, cached, write_file_atomic
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.sources.imagenet21k import (
    LISTS,
    SPLIT_RULE,
    ClassList,
    class_list,
    imagenet21k_dir_stamp,
    imagenet21k_listing_sha256,
    list_imagenet21k_images,
    read_wnid_list,
)
from shiftbench.tables.fingerprint import sha256_file, sha256_json, sha256_text

DATASET = "imagenet21k"
IMAGE_COLUMNS = {"image_id": pl.String, "wnid": pl.String, "imagenet_split": pl.String}
# What no image folder records (sources.images_sha256 when SHIFTBENCH_IMAGENET21K_DIR is unset): the value releases
# before content hashing gave it, kept so that the versions built without images keep their ids.
NO_IMAGES = sha256_text(f"{sha256_text(SPLIT_RULE)}|0")


def class_lists(settings: Settings) -> dict[str, ClassList]:
    """Every ImageNet class list, from the package or an installed timm (SHIFTBENCH_IMAGENET21K_CLASS_SOURCE)."""
    source = settings.of(BreedsSettings).imagenet21k_class_source
    return {name: class_list(name, source=source) for name in LISTS}


def spec_classes(settings: Settings, spec: BreedsSpec) -> ClassList:
    """The classes a 21k spec draws from: a shipped list or the user's wnid file."""
    name = spec.class_list
    if name in LISTS:
        return class_list(name, source=settings.of(BreedsSettings).imagenet21k_class_source)
    return read_wnid_list(Path(name))


def class_files_fingerprint(settings: Settings) -> str:
    own = settings.of(BreedsSettings)
    parts = [f"{name}:{listed.provenance.get('sha256')}" for name, listed in class_lists(settings).items()]
    if own.imagenet21k_calibration is not None and own.imagenet21k_calibration.is_file():
        parts.append(f"edits:{sha256_file(own.imagenet21k_calibration)}")
    return sha256_text("\n".join([f"source={own.imagenet21k_class_source}", *parts]))


def image_files_stamp(settings: Settings) -> str:
    """The image folder's observed data version: its stamp, cheap. A copy looks changed and is listed again;
    the versions built from it keep their ids (they record the listing's hash: :func:`images`)."""
    return imagenet21k_dir_stamp(settings.of(BreedsSettings).imagenet21k_dir)


def _wordnet(artifact: CachedArtifact) -> Hierarchy:
    return Hierarchy.from_tables(
        pl.read_parquet(artifact.path / "edges.parquet"), pl.read_parquet(artifact.path / "nodes.parquet")
    )


def calibrated_hierarchy(settings: Settings, wordnet_artifact: CachedArtifact) -> CachedArtifact:
    """WordNet restricted to the ancestors of every ImageNet class list, calibrated into a tree."""
    own = settings.of(BreedsSettings)
    lists = class_lists(settings)
    union = sorted(set().union(*(listed.wnids for listed in lists.values())))
    wordnet = _wordnet(wordnet_artifact)
    present = [wnid for wnid in union if wnid in wordnet.graph]
    result = cal.from_wordnet(
        wordnet,
        wordnet_artifact.fingerprint,
        present,
        own.imagenet21k_calibration,
        "ImageNet-21k: no release",
    )
    missing = sorted(set(union) - set(present))
    provenance = {name: dict(listed.provenance) for name, listed in lists.items()}
    result = dataclasses.replace(
        result,
        origin={**result.origin, "missing_from_wordnet": missing, "class_lists": provenance},
    )
    fingerprint = sha256_json({"sources": result.sources, "lists": provenance, "missing": missing})
    meta = {
        "kind": result.kind,
        "fingerprint": fingerprint,
        "n_nodes": len(result.hierarchy.nodes),
        "n_classes": len(present),
        "missing_from_wordnet": missing,
        "class_source": own.imagenet21k_class_source,
        "is_tree": result.hierarchy.is_tree(),
    }
    return cached(settings.cache_dir / "imagenet21k_hierarchy" / fingerprint[:32], fingerprint, meta, result.save)


def images(settings: Settings) -> CachedArtifact:
    """The listed images of every class folder under SHIFTBENCH_IMAGENET21K_DIR (none when unset), named by the
    listing's content hash: a copy of the same images (new times, another disk) gives the same versions. The
    folders' stamp is only a cache key: an unchanged folder is not listed again."""
    root = settings.of(BreedsSettings).imagenet21k_dir
    if root is None:
        return _cache_listing(settings, pl.DataFrame(schema=IMAGE_COLUMNS), NO_IMAGES, None)
    union = sorted(set().union(*(listed.wnids for listed in class_lists(settings).values())))
    wanted = sha256_text("\n".join(union))  # the classes listed: another class source lists other folders
    key = sha256_text(f"{root.resolve()}|{imagenet21k_dir_stamp(root)}|{wanted}")
    known = settings.cache_dir / "imagenet21k_listings" / f"{key[:32]}.json"
    if known.is_file():  # listed before, and no class folder changed since
        seen = json.loads(known.read_text("utf-8"))
        fingerprint, n_images = str(seen["fingerprint"]), int(seen["n_images"])
        folder = settings.cache_dir / "imagenet21k_images" / fingerprint[:32]
        if (folder / "images.parquet").is_file():
            return CachedArtifact(folder, fingerprint, _meta(fingerprint, n_images, root))
    table = list_imagenet21k_images(root, union)
    artifact = _cache_listing(settings, table, imagenet21k_listing_sha256(table), root)
    known.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(known, json.dumps({"fingerprint": artifact.fingerprint, "n_images": table.height}))
    return artifact


def _meta(fingerprint: str, n_images: int, root: Path | None) -> dict[str, Any]:
    kind = "imagenet21k-dir" if root is not None else "none"
    return {
        "kind": kind,
        "fingerprint": fingerprint,
        "n_images": n_images,
        "path": str(root) if root is not None else None,
    }


def _cache_listing(settings: Settings, table: pl.DataFrame, fingerprint: str, root: Path | None) -> CachedArtifact:
    return cached(
        settings.cache_dir / "imagenet21k_images" / fingerprint[:32],
        fingerprint,
        _meta(fingerprint, table.height, root),
        lambda tmp: table.write_parquet(tmp / "images.parquet"),
    )


def _unknown_wnid(listed: ClassList, wnid: str, what: str) -> InputError:
    """A user's wnid outside the ImageNet-21k hierarchy, named by its file and line."""
    path = Path(listed.provenance.get("file", ""))
    line = None
    if listed.name == "user" and path.is_file():
        lines = path.read_text("utf-8").splitlines()
        line = next((i for i, text in enumerate(lines, start=1) if text.split("#")[0].strip() == wnid), None)
    return InputError(f"{wnid} is {what}", path=path if line else None, line=line, parameter="classes")


def spec_hierarchy(
    settings: Settings, spec: BreedsSpec, artifact: CachedArtifact
) -> tuple[cal.CalibratedHierarchy, dict[str, Any]]:
    """The shared 21k tree seen through one spec's class list, and what the version records of that list."""
    calibrated = cal.CalibratedHierarchy.load(artifact.path)
    listed = spec_classes(settings, spec)
    missing = set(artifact.meta.get("missing_from_wordnet", []))
    if listed.name == "user":
        for wnid in listed.wnids:
            if wnid not in calibrated.hierarchy.graph:
                why = "not in WordNet 3.0" if wnid in missing else "not an ImageNet-21k class (nor ImageNet-1k)"
                raise _unknown_wnid(listed, wnid, why)
    view = dataclasses.replace(calibrated, dataset_classes=tuple(listed.wnids))
    dropped = sorted(set(listed.wnids) - set(view.classes_in_hierarchy))
    record = {
        "classes": listed.name,
        "classes_sha256": listed.provenance.get("sha256"),
        "classes_source": listed.provenance.get("source"),
        **({"timm_version": listed.provenance["timm_version"]} if "timm_version" in listed.provenance else {}),
        "classes_file": Path(str(listed.provenance.get("file", ""))).name,
        "classes_missing_from_wordnet": dropped,
    }
    return view, record


def card_lines(record: Mapping[str, Any], n_images: int, has_dir: bool) -> tuple[str, ...]:
    """The card's provenance of the classes and the images."""
    timm = f"timm {record['timm_version']}, " if record.get("timm_version") else ""
    classes = (
        f"Classes: {record['classes']} ({timm}{record.get('classes_file')}, SHA-256 {record.get('classes_sha256')}; "
        "timm's data files, Apache-2.0)"
    )
    if record.get("classes_missing_from_wordnet"):
        dropped = record["classes_missing_from_wordnet"]
        classes += f"; {len(dropped)} listed synset(s) not in WordNet 3.0 left out: {', '.join(dropped)}"
    if not has_dir:
        images = (
            "Images: none listed (SHIFTBENCH_IMAGENET21K_DIR unset when built): this version holds the classes and "
            "subpopulations only"
        )
    else:
        images = (
            f"Images: ImageNet-21k ({n_images:,} listed; ImageNet terms of access: non-commercial research and "
            "education); not redistributed"
        )
    return classes, images
